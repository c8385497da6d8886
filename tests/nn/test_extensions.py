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


class _Built:
    def __init__(self, library: Path) -> None:
        self.__file__ = str(library)


def test_a_finished_build_is_known_without_building_and_a_changed_source_is_not(monkeypatch, tmp_path):
    """`is_built` is what lets the defaults take the kernels without ever pausing for a compiler:
    true only after a build of exactly these sources, for this CPU, whose library is still there."""
    source = tmp_path / "src" / "kernels.cpp"
    source.parent.mkdir()
    source.write_text("int f() { return 1; }\n")
    library = tmp_path / "cache" / "probe.so"
    library.parent.mkdir()
    library.write_bytes(b"\x7fELF")
    builds = []
    monkeypatch.setattr(cpp_extension, "_get_build_directory", lambda name, verbose: str(tmp_path / "cache" / name))
    monkeypatch.setattr(cpp_extension, "load", lambda **kw: builds.append(kw["name"]) or _Built(library))
    monkeypatch.setattr(extensions, "cpu_identity", lambda: b"flags : fpu avx2")

    assert not extensions.is_built("probe", source)
    assert builds == []  # asking never builds
    extensions.build("probe", source, what="probe", fallback="none")
    assert extensions.is_built("probe", source)
    assert not extensions.is_built("probe", source, march="x86-64-v2")  # another instruction set: another build
    monkeypatch.setattr(extensions, "cpu_identity", lambda: b"flags : fpu avx2 avx512f")
    assert not extensions.is_built("probe", source)  # another CPU
    monkeypatch.setattr(extensions, "cpu_identity", lambda: b"flags : fpu avx2")
    source.write_text("int f() { return 2; }\n")
    assert not extensions.is_built("probe", source)  # the source changed since
    extensions.build("probe", source, what="probe", fallback="none")
    assert extensions.is_built("probe", source)
    library.unlink()
    assert not extensions.is_built("probe", source)  # the library is gone from the cache


def test_a_failed_build_is_not_marked_built(monkeypatch, tmp_path):
    source = tmp_path / "kernels.cpp"
    source.write_text("int f();\n")
    monkeypatch.setattr(cpp_extension, "_get_build_directory", lambda name, verbose: str(tmp_path / name))

    def fail(**kw):
        raise RuntimeError("no compiler")

    monkeypatch.setattr(cpp_extension, "load", fail)
    with pytest.warns(UserWarning, match="could not be built .*no compiler"):
        assert extensions.build("probe", source, what="probe", fallback="none") is None
    assert not extensions.is_built("probe", source)
