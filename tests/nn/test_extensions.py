"""attnlab.nn.extensions: where C++ builds are cached, and under which flags."""

from pathlib import Path

import pytest
from torch.utils import cpp_extension

from attnlab.nn import extensions

SOURCE = Path(extensions.__file__).with_name("kernels.cpp")


def _flags_built_on(monkeypatch, cpu: bytes) -> list[str]:
    seen = {}

    def load(**kwargs):
        seen.update(kwargs)
        return "built"

    monkeypatch.setattr(cpp_extension, "load", load)
    monkeypatch.setattr(extensions, "cpu_identity", lambda: cpu)
    assert extensions.build("probe", SOURCE, what="probe", fallback="none") == "built"
    return seen["extra_cflags"]


def test_another_cpu_gets_its_own_build(monkeypatch):
    """-march=native code from one CPU can die of an illegal instruction on another that reaches the
    same cache folder: the CPU's identity is in the flags, so PyTorch builds again for it."""
    a = _flags_built_on(monkeypatch, b"flags : fpu avx2")
    b = _flags_built_on(monkeypatch, b"flags : fpu avx2 avx512f")
    assert "-march=native" in a
    assert a != b
    assert _flags_built_on(monkeypatch, b"flags : fpu avx2") == a  # same CPU, same build


@pytest.mark.skipif(not Path("/proc/cpuinfo").exists(), reason="Linux's CPU listing")
def test_the_cpu_identity_names_the_instruction_sets_once():
    text = extensions.cpu_identity().decode()
    lines = text.splitlines()
    assert any(line.startswith(("flags", "Features")) for line in lines)
    assert len(lines) == len(set(lines))


def test_avx2_cpus_get_8_float_loops_and_others_gcc_s_choice(monkeypatch):
    """GCC's tuning for the Zen 1 it detects on these EPYC machines vectorizes loops 4 floats wide;
    AVX2 CPUs without AVX-512 are built 8 wide, every other CPU (and a named -march) as GCC picks."""
    wide = "-mprefer-vector-width=256"
    assert wide in _flags_built_on(monkeypatch, b"model name : AMD EPYC\nflags : fpu avx fma avx2")
    assert wide not in _flags_built_on(monkeypatch, b"flags : fpu avx2 avx512f")
    assert wide not in _flags_built_on(monkeypatch, b"flags : fpu sse4_2 avx")
    assert wide not in _flags_built_on(monkeypatch, b"Features : fp asimd")
    assert extensions.vector_width_flags(b"flags : fpu avx2", "x86-64-v3") == []
