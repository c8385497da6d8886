"""Peak memory of one causal attention forward + backward, the explicit path (which materialises the
(T, T) weights) against the fused kernel, each in a fresh process; and the resident-set readings
(`peak_rss_bytes`, `reset_peak_rss`) that `attnlab.studies.cost` shares.

Legend: B batch, T time, H heads, D head dim.
"""

import os
import resource
import subprocess
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from attnlab.nn import causal_mask, scaled_dot_product_attention
from attnlab.studies.bench.cases import ATTENTION_HEAD_DIM, ATTENTION_HEADS, ATTENTION_PATHS
from attnlab.studies.bench.results import MemoryRow


def _attention_inputs(seq_len: int, device: torch.device, dtype: torch.dtype) -> list[torch.Tensor]:
    """q, k, v `(1, H, T, D)` that require gradients."""
    shape = (1, ATTENTION_HEADS, seq_len, ATTENTION_HEAD_DIM)
    return [torch.randn(shape, device=device, dtype=dtype, requires_grad=True) for _ in range(3)]


def _attention_forward_backward(path: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    if path == "explicit":
        # The causal mask is built inside: a (T, T) bool tensor is part of what this path costs.
        out, _ = scaled_dot_product_attention(q, k, v, causal_mask(q.size(-2), device=q.device))
    elif path == "fused":
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    else:
        raise ValueError(f"path must be one of {ATTENTION_PATHS}, got {path!r}")
    out.sum().backward()


def peak_rss_bytes() -> int:
    """This process's peak resident memory. On Linux that is VmHWM, not ru_maxrss: a child's
    ru_maxrss starts at its parent's peak (the kernel carries it over at fork and exec), so a child of
    a process that holds models would report nothing below that."""
    try:
        with open("/proc/self/status") as f:
            kib = next(line.split()[1] for line in f if line.startswith("VmHWM:"))
        return int(kib) * 1024
    except (OSError, StopIteration):
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return rss if sys.platform == "darwin" else rss * 1024  # bytes on macOS, KiB elsewhere


def reset_peak_rss() -> None:
    """Lower the peak to the current resident memory (Linux >= 4.0), so that transient memory of
    the imports does not hide a smaller case. Elsewhere the peak stays as it is."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def attention_memory_case(path: str, seq_len: int, *, threads: int | None = None) -> float:
    """MiB that one causal forward + backward of `path` ("explicit" or "fused") adds to this
    process's peak resident memory, fp32 on CPU, B=1, H=4, D=64.

    The peak is a high-water mark over the life of the process, so each case needs a process of its
    own (`cpu_attention_memory` starts one); PyTorch's CPU allocator is invisible to tracemalloc."""
    if threads is not None:
        torch.set_num_threads(threads)
    torch.manual_seed(0)
    # A tiny warm-up first, so kernel code and thread pools are paged in before the baseline.
    _attention_forward_backward(path, *_attention_inputs(8, torch.device("cpu"), torch.float32))
    q, k, v = _attention_inputs(seq_len, torch.device("cpu"), torch.float32)
    reset_peak_rss()
    before = peak_rss_bytes()
    _attention_forward_backward(path, q, k, v)
    return (peak_rss_bytes() - before) / 2**20


_MEMORY_CHILD = (
    "import sys; from attnlab.studies.bench.memory import attention_memory_case; "
    "print(attention_memory_case(sys.argv[1], int(sys.argv[2]), threads=int(sys.argv[3])))"
)


def child_env() -> dict[str, str]:
    """The environment for a child Python process that imports this very attnlab, installed or not."""
    here = str(Path(__file__).resolve().parents[2])
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)}


def cpu_attention_memory(path: str, seq_len: int) -> float:
    """`attention_memory_case` in a fresh Python process -> MiB."""
    proc = subprocess.run(
        [sys.executable, "-c", _MEMORY_CHILD, path, str(seq_len), str(torch.get_num_threads())],
        capture_output=True,
        text=True,
        env=child_env(),
    )
    if proc.returncode != 0:
        raise RuntimeError(f"attention memory case {path} T={seq_len} failed:\n{proc.stderr}")
    return float(proc.stdout.split()[-1])


def cuda_attention_memory(path: str, seq_len: int, device: torch.device, dtype: torch.dtype) -> float:
    """MiB above the inputs that one causal forward + backward of `path` allocates on the GPU."""
    # Warm-up: library workspaces (cuBLAS) stay allocated once made; they are not attention's cost.
    _attention_forward_backward(path, *_attention_inputs(8, device, dtype))
    q, k, v = _attention_inputs(seq_len, device, dtype)
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    held = torch.cuda.memory_allocated(device)
    _attention_forward_backward(path, q, k, v)
    torch.cuda.synchronize(device)
    return (torch.cuda.max_memory_allocated(device) - held) / 2**20


def attention_memory(device: torch.device, lengths: tuple[int, ...]) -> list[MemoryRow]:
    """Both attention paths at every length (doubling), with the growth from the previous length.
    bf16 on GPU, where the fused path needs half precision for its flash kernels; fp32 on CPU."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    rows = []
    for path in ATTENTION_PATHS:
        previous = None
        for seq_len in lengths:
            if device.type == "cuda":
                peak = cuda_attention_memory(path, seq_len, device, dtype)
            else:
                peak = cpu_attention_memory(path, seq_len)
            # None after a non-positive peak: RSS is too coarse at that size to divide by it.
            growth = peak / previous if previous is not None and previous > 0 else None
            rows.append(MemoryRow(path, seq_len, peak, growth, str(dtype).removeprefix("torch.")))
            previous = peak
    return rows
