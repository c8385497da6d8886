"""attnlab.accel.extensions: where C++ builds are cached, and under which flags."""

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

from attnlab.accel import extensions

pytestmark = [pytest.mark.slow, pytest.mark.build]

SOURCE = Path(extensions.__file__).with_name("kernels.cpp")


def _flags_on(monkeypatch, cpu: bytes, march: str = "native") -> list[str]:
    monkeypatch.setattr(extensions, "cpu_identity", lambda: cpu)
    return extensions.compiler_flags(march)


def test_another_cpu_gets_its_own_build(monkeypatch, tmp_path):
    """-march=native code from one CPU can die of an illegal instruction on another that reaches the
    same cache folder: the CPU's identity is in the build's key, so it builds again for it."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    folder = {}
    for cpu in (b"flags : fpu avx2", b"flags : fpu avx2 avx512f"):
        monkeypatch.setattr(extensions, "cpu_identity", lambda cpu=cpu: cpu)
        folder[cpu] = extensions.build_folder("probe", SOURCE)
        assert folder[cpu].parent == tmp_path and folder[cpu].name.startswith("probe_")
    assert folder[b"flags : fpu avx2"] != folder[b"flags : fpu avx2 avx512f"]
    assert extensions.build_folder("probe", SOURCE) == folder[b"flags : fpu avx2 avx512f"]  # same CPU, same build


def test_the_instruction_set_comes_from_attnlab_march_and_keys_the_build(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.delenv(extensions.MARCH_VARIABLE, raising=False)
    native = extensions.build_folder("probe", SOURCE)
    assert extensions.default_march() == "native"
    monkeypatch.setenv(extensions.MARCH_VARIABLE, "x86-64-v3")
    assert extensions.default_march() == "x86-64-v3"
    assert "-march=x86-64-v3" in extensions.compiler_flags(extensions.default_march())
    assert extensions.build_folder("probe", SOURCE) not in (native, extensions.build_folder("probe", SOURCE, "native"))


def test_each_installation_has_its_own_build(monkeypatch, tmp_path):
    """Two checkouts (the source's path) or two environments (sys.prefix) on one machine each keep
    their own folder, so neither rewrites the other's build.ninja."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    a, b = tmp_path / "a" / "nn" / "k.cpp", tmp_path / "b" / "nn" / "k.cpp"
    for source in (a, b):
        source.parent.mkdir(parents=True)
        source.write_text("int f() { return 1; }\n")
    here = extensions.build_folder("probe", a)
    assert extensions.build_folder("probe", b) != here
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "another-venv"))
    assert extensions.build_folder("probe", a) != here


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
    assert wide in _flags_on(monkeypatch, b"model name : AMD EPYC\nflags : fpu avx fma avx2")
    assert wide not in _flags_on(monkeypatch, b"flags : fpu avx2 avx512f")
    assert wide not in _flags_on(monkeypatch, b"flags : fpu sse4_2 avx")
    assert wide not in _flags_on(monkeypatch, b"Features : fp asimd")
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
    library = tmp_path / "lib" / "probe.so"
    library.parent.mkdir()
    library.write_bytes(b"\x7fELF")
    builds = []
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "cache"))
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
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "cache"))

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
    "import sys; from pathlib import Path; from attnlab.accel.extensions import build; "
    "print(build('attnlab_probe', Path(sys.argv[1]), what='probe', fallback='none').answer())"
)


def _build_in_child(source: Path, cache: Path) -> subprocess.Popen:
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(cache)}
    command = [sys.executable, "-c", BUILD, str(source)]
    return subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True
    )


def test_a_build_killed_halfway_does_not_stop_the_next_one(tmp_path, monkeypatch):
    """PyTorch's `lock` file outlives a SIGKILLed build; PyTorch alone then waits on it forever (a CI
    run hung here for 90 minutes). The next build removes it, says so, and builds."""
    source, cache = tmp_path / "src" / "probe.cpp", tmp_path / "cache"
    source.parent.mkdir()
    source.write_text(TINY)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(cache))
    lock = extensions.build_folder("attnlab_probe", source) / "lock"
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


def _built_in_child(source: Path, cache: Path) -> None:
    child = _build_in_child(source, cache)
    out, err = child.communicate(timeout=180)
    assert child.returncode == 0 and out.split() == ["42"], err


def test_two_installations_load_their_builds_without_rebuilding_each_other(tmp_path, monkeypatch):
    """The same extension from two source folders (two checkouts, or a project venv beside a
    notebook venv), used in turns: each builds once, then loads its own library untouched. With
    one folder per extension name, each turn rewrote the other's build.ninja and compiled again."""
    cache = tmp_path / "cache"
    sources = [tmp_path / place / "nn" / "probe.cpp" for place in ("checkout-a", "checkout-b")]
    for source in sources:
        source.parent.mkdir(parents=True)
        source.write_text(TINY)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(cache))
    folders = [extensions.build_folder("attnlab_probe", source) for source in sources]
    assert folders[0] != folders[1]
    for source in sources:
        _built_in_child(source, cache)
    outputs = [path for folder in folders for path in folder.iterdir() if path.suffix in (".so", ".ninja")]
    built = {path: path.stat().st_mtime_ns for path in outputs}
    assert len(built) == 4  # a library and a ninja file in each folder
    for source in sources:  # each in turn after the other's build: neither rebuilds
        _built_in_child(source, cache)
    assert {path: path.stat().st_mtime_ns for path in built} == built


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
