"""attnlab.nn.extensions: where C++ builds are cached, and under which flags."""

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from torch.utils import cpp_extension

from attnlab.nn import extensions

SOURCE = Path(extensions.__file__).with_name("kernels.cpp")


def _flags_built_on(monkeypatch, cpu: bytes, tmp_path: Path) -> list[str]:
    seen = {}

    def load(**kwargs):
        seen.update(kwargs)
        return "built"

    monkeypatch.setattr(cpp_extension, "load", load)
    monkeypatch.setattr(cpp_extension, "_get_build_directory", lambda name, verbose: str(tmp_path / name))
    monkeypatch.setattr(extensions, "cpu_identity", lambda: cpu)
    assert extensions.build("probe", SOURCE, what="probe", fallback="none") == "built"
    return seen["extra_cflags"]


def test_another_cpu_gets_its_own_build(monkeypatch, tmp_path):
    """-march=native code from one CPU can die of an illegal instruction on another that reaches the
    same cache folder: the CPU's identity is in the flags, so PyTorch builds again for it."""
    a = _flags_built_on(monkeypatch, b"flags : fpu avx2", tmp_path)
    b = _flags_built_on(monkeypatch, b"flags : fpu avx2 avx512f", tmp_path)
    assert "-march=native" in a
    assert a != b
    assert _flags_built_on(monkeypatch, b"flags : fpu avx2", tmp_path) == a  # same CPU, same build


@pytest.mark.skipif(not Path("/proc/cpuinfo").exists(), reason="Linux's CPU listing")
def test_the_cpu_identity_names_the_instruction_sets_once():
    text = extensions.cpu_identity().decode()
    lines = text.splitlines()
    assert any(line.startswith(("flags", "Features")) for line in lines)
    assert len(lines) == len(set(lines))


def test_avx2_cpus_get_8_float_loops_and_others_gcc_s_choice(monkeypatch, tmp_path):
    """GCC's tuning for the Zen 1 it detects on these EPYC machines vectorizes loops 4 floats wide;
    AVX2 CPUs without AVX-512 are built 8 wide, every other CPU (and a named -march) as GCC picks."""
    wide = "-mprefer-vector-width=256"
    assert wide in _flags_built_on(monkeypatch, b"model name : AMD EPYC\nflags : fpu avx fma avx2", tmp_path)
    assert wide not in _flags_built_on(monkeypatch, b"flags : fpu avx2 avx512f", tmp_path)
    assert wide not in _flags_built_on(monkeypatch, b"flags : fpu sse4_2 avx", tmp_path)
    assert wide not in _flags_built_on(monkeypatch, b"Features : fp asimd", tmp_path)
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


TINY = (
    '#include <pybind11/pybind11.h>\nPYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("answer", [] { return 42; }); }\n'
)
BUILD = (
    "import sys; from pathlib import Path; from attnlab.nn.extensions import build; "
    "print(build('attnlab_probe', Path(sys.argv[1]), what='probe', fallback='none').answer())"
)


def _build_in_child(source: Path, cache: Path) -> subprocess.Popen:
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(cache)}
    command = [sys.executable, "-c", BUILD, str(source)]
    return subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True
    )


def test_a_build_killed_halfway_does_not_stop_the_next_one(tmp_path):
    """PyTorch's `lock` file outlives a SIGKILLed build; PyTorch alone then waits on it forever (a CI
    run hung here for 90 minutes). The next build removes it, says so, and builds."""
    source, cache = tmp_path / "src" / "probe.cpp", tmp_path / "cache"
    source.parent.mkdir()
    source.write_text(TINY)
    lock = cache / "attnlab_probe" / "lock"
    first = _build_in_child(source, cache)
    deadline = time.monotonic() + 120
    while not lock.exists() and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    os.killpg(first.pid, signal.SIGKILL)  # the compiler too
    first.wait(timeout=30)
    assert lock.exists(), "the build was not under way when killed"

    second = _build_in_child(source, cache)
    try:
        out, err = second.communicate(timeout=180)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(second.pid, signal.SIGKILL)
    assert second.returncode == 0 and out.split() == ["42"], err
    assert f"removed {lock}, left by a build that did not finish" in err
    assert not lock.exists()


def test_a_live_builders_lock_is_waited_for_not_removed(tmp_path):
    """Two builds of one extension at once: the second waits for the first to finish, as PyTorch's
    own lock makes it, and leaves the first's `lock` file alone."""
    folder = tmp_path / "attnlab_probe"
    entered, release = threading.Event(), threading.Event()
    seen = []

    def first():
        with extensions.build_lock(folder):
            (folder / "lock").touch()  # PyTorch's, while it builds
            entered.set()
            release.wait(timeout=30)
            (folder / "lock").unlink()

    def second():
        with extensions.build_lock(folder):
            seen.append((folder / "lock").exists())

    a = threading.Thread(target=first)
    a.start()
    assert entered.wait(timeout=30)
    b = threading.Thread(target=second)
    b.start()
    b.join(timeout=0.5)
    assert b.is_alive() and (folder / "lock").exists()  # waiting, and the live lock kept
    release.set()
    a.join(timeout=30)
    b.join(timeout=30)
    assert seen == [False]
