"""Device and precision, resolved in one place. Modules follow `x.device`; only the trainer and the
CLI ask for a device."""

import contextlib
import ctypes
import ctypes.util
import functools
import platform
import sys
from pathlib import Path

import torch

from attnlab.errors import UserError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(name: str = "auto") -> torch.device:
    """ "auto" -> cuda when available, else cpu; "cpu", "cuda", "cuda:1" as given."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UserError(f"unknown device {name!r}; use auto, cpu or cuda") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"device {name!r} asked for, but no CUDA GPU is available; use --device cpu")
    return device


def autocast(device: torch.device, dtype: str) -> contextlib.AbstractContextManager:
    """Mixed precision for the forward pass: bf16 or fp16 autocast keeps fp32 master weights."""
    if dtype not in DTYPES:
        raise UserError(f"unknown dtype {dtype!r}; use one of {', '.join(DTYPES)}")
    if dtype == "float32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=DTYPES[dtype])


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)
_KEEP_BYTES = 1 << 30


@functools.cache
def keep_freed_memory() -> bool:
    """Have the C allocator keep freed blocks of up to 1 GiB for reuse instead of handing them back
    to the system; True where it could (Linux with glibc), False elsewhere. Once per process.

    glibc serves blocks over 32 MiB from fresh pages and returns them when freed, so a training
    step on the CPU that allocates large tensors (a masked-LM head's 26M logits and their
    gradient) takes a page fault for every 4 KiB of them, every step (what it costs: docs/history.md,
    "Where a pre-training step's time goes"). PyTorch's performance guide suggests jemalloc or tcmalloc for the same
    reason; this is glibc's own switch, with nothing to install. The process then keeps its peak
    heap until it exits, which a training run reaches anyway."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):  # not glibc (musl has no mallopt)
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, _KEEP_BYTES)) and bool(mallopt(_M_TRIM_THRESHOLD, 2**31 - 1))


@functools.cache
def cpu_has_bf16_matmul() -> bool:
    """Whether PyTorch multiplies bf16 matrices on this CPU with oneDNN's kernels, which need AVX-512
    (native bf16 instructions where the CPU has AVX512-BF16 or AMX). Without them, as on CPUs with
    AVX2 alone, bf16 products take PyTorch's reference loop, many times slower than fp32 (measured
    on the wikitext2-mlm preset: docs/history.md, "On the AVX2 CPU")."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())  # PyTorch's own test for that dispatch
    except (AttributeError, RuntimeError):  # a build without oneDNN
        return False


# The CPU features that make bf16 products fast: native bf16 dot products (AVX512-BF16) or Intel's
# matrix tiles (AMX), as Linux names them.
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The instruction-set flags of /proc/cpuinfo (empty where the system has no such file)."""
    return frozenset(word for line in cpuinfo_lines(("flags",)) for word in line.partition(":")[2].split())


def resolve_dtype(name: str, device: torch.device, flags: frozenset[str] | None = None) -> tuple[str, str]:
    """The training dtype `name` stands for on `device`, and why: "auto" is "bfloat16" where the
    hardware runs it fast (a CUDA GPU with bf16, a CPU with one of `BF16_CPU_FLAGS`; `flags`
    defaults to this CPU's), else "float32" (bf16 without them is many times slower on a CPU,
    `slow_dtype_note`). Any other name is returned as given.

    resolve_dtype("auto", torch.device("cpu"), frozenset({"avx2"})) -> ("float32", "... no AVX512-BF16 or AMX")"""
    if name != "auto":
        return name, "as asked for"
    if device.type == "cuda":
        if torch.cuda.is_bf16_supported():
            return "bfloat16", "this GPU computes in bf16"
        return "float32", "this GPU has no bf16"
    found = sorted(set(BF16_CPU_FLAGS) & (cpu_flags() if flags is None else flags))
    if device.type == "cpu" and found:
        return "bfloat16", f"this CPU has {', '.join(found)}"
    return "float32", f"this {device.type.upper()} has no AVX512-BF16 or AMX for fast bf16"


def slow_dtype_note(device: torch.device, dtype: str) -> str | None:
    """A one-line warning where `dtype` would make training on `device` far slower than fp32, else None."""
    if device.type == "cpu" and dtype == "bfloat16" and not cpu_has_bf16_matmul():
        return (
            "warning: train.dtype = 'bfloat16' on a CPU without bf16 matrix kernels (they need AVX-512): "
            "products run ~40x slower than in float32 here; use --set train.dtype=float32"
        )
    return None


def cpuinfo_lines(keys: tuple[str, ...]) -> list[str]:
    """The lines of Linux's /proc/cpuinfo that start with one of `keys`, each once, in order (the
    file repeats them per core); [] where the system has no such file."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    return list(dict.fromkeys(line for line in text.splitlines() if line.startswith(keys)))


@functools.cache
def cpu_description() -> str:
    """The CPU's model, where the system names it, and the widest vector instructions PyTorch uses
    on it, e.g. "<model name>, AVX2": CPU timings depend on both (bf16 products, kernel widths)."""
    names = [line.partition(":")[2].strip() for line in cpuinfo_lines(("model name",))]
    name = next((n for n in names if n), platform.processor() or platform.machine())
    return f"{name}, {torch.backends.cpu.get_cpu_capability()}"
