"""attnlab.device: the C allocator's switch that the trainer throws for CPU training."""

import subprocess
import sys
import textwrap

import pytest
import torch

# In a fresh interpreter: whether a 64 MiB block is served from fresh mapped pages (hblkhd, the
# bytes glibc holds in mmap'ed blocks, grows while it is held) before and after the switch.
PROBE = textwrap.dedent(
    """
    import ctypes, ctypes.util
    libc = ctypes.CDLL(ctypes.util.find_library("c"))

    class MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
            "keepcost")]

    libc.mallinfo2.restype = MallInfo2
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]

    def mapped_while_held(n=64 << 20):
        before = libc.mallinfo2().hblkhd
        block = libc.malloc(n)
        ctypes.memset(block, 1, n)
        mapped = libc.mallinfo2().hblkhd - before
        libc.free(block)
        return mapped >= n

    from attnlab.device import keep_freed_memory
    first = mapped_while_held()
    switched = keep_freed_memory()
    print(first, switched, mapped_while_held(), keep_freed_memory())
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's switch")
def test_keep_freed_memory_serves_large_blocks_from_the_heap():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True).stdout.split()
    if out[1] == "False":
        pytest.skip("this C library has no mallopt (not glibc)")
    # Before: glibc maps a 64 MiB block afresh (and hands it back on free). After: from the heap,
    # kept for the next step. The second call is cached and says the same.
    assert out == ["True", "True", "False", "True"]


def test_bf16_training_on_a_cpu_without_bf16_kernels_is_warned_of(monkeypatch):
    from attnlab import device

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    monkeypatch.setattr(device, "cpu_has_bf16_matmul", lambda: False)
    note = device.slow_dtype_note(cpu, "bfloat16")
    assert note is not None and "float32" in note and "\n" not in note  # one line that names the fix
    assert device.slow_dtype_note(cpu, "float32") is None
    assert device.slow_dtype_note(cuda, "bfloat16") is None  # GPUs have their own bf16 units
    monkeypatch.setattr(device, "cpu_has_bf16_matmul", lambda: True)
    assert device.slow_dtype_note(cpu, "bfloat16") is None


def test_the_bf16_check_agrees_with_the_cpus_instruction_sets():
    from attnlab.device import cpu_has_bf16_matmul

    # oneDNN's bf16 products need AVX-512; where PyTorch reports no AVX-512 there are none.
    if not torch.cpu._is_avx512_supported():
        assert not cpu_has_bf16_matmul()
    if torch.cpu._is_avx512_bf16_supported():
        assert cpu_has_bf16_matmul()


def test_the_cpu_description_names_the_vector_instructions_pytorch_uses():
    from attnlab.device import cpu_description

    name, _, isa = cpu_description().rpartition(", ")
    assert name  # a model name, or at least the architecture
    assert isa == torch.backends.cpu.get_cpu_capability()


@pytest.mark.parametrize(
    "flags, chosen",
    [
        ({"avx2", "fma"}, "float32"),  # this machine kind, and most laptops
        ({"avx2", "avx512f", "avx512bw"}, "float32"),  # AVX-512 without bf16 dot products
        ({"avx512f", "avx512_bf16"}, "bfloat16"),  # Cooper Lake, Zen 4
        ({"avx512f", "amx_tile", "amx_bf16"}, "bfloat16"),  # Sapphire Rapids
    ],
)
def test_auto_dtype_on_a_cpu_is_bf16_only_with_native_bf16_instructions(flags, chosen):
    from attnlab.device import resolve_dtype

    dtype, why = resolve_dtype("auto", torch.device("cpu"), frozenset(flags))
    assert dtype == chosen and why
    for explicit in ("float32", "bfloat16"):  # an explicit dtype is obeyed whatever the CPU
        assert resolve_dtype(explicit, torch.device("cpu"), frozenset(flags))[0] == explicit


def test_auto_dtype_on_this_cpu_agrees_with_pytorchs_own_checks():
    from attnlab.device import resolve_dtype

    fast_bf16 = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    dtype, why = resolve_dtype("auto", torch.device("cpu"))
    assert dtype == ("bfloat16" if fast_bf16 else "float32"), why
