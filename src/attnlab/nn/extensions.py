"""Building attnlab's C++ sources with PyTorch's extension tools.

A build takes about a minute and is cached afterwards (in `TORCH_EXTENSIONS_DIR`, by default
~/.cache/torch_extensions); the code that uses one falls back to PyTorch's operators, with a
warning, where it cannot be built (no compiler, no ninja). `attnlab kernels build` (which `make`
runs when it installs attnlab) builds them ahead of time; `is_built` then says so without building,
which is how the defaults (`"auto"`) take the kernels only when using them costs no pause. A
build killed halfway does not stop later ones (`build_lock`).
"""

import contextlib
import hashlib
import os
import platform
import sysconfig
import warnings
from pathlib import Path
from types import ModuleType

from attnlab.device import cpuinfo_lines


def build(name: str, source: Path, *, what: str, fallback: str, march: str = "native") -> ModuleType | None:
    """The extension `name` compiled from `source` (and the headers beside it) for the instruction
    set `march` (GCC's -march: this CPU's by default), or None with a warning "the {what} could
    not be built (...); {fallback}"."""
    from torch.utils import cpp_extension

    # The build runs `ninja`, which the `ninja` package installs beside this interpreter: on PATH
    # only in an activated environment.
    scripts = sysconfig.get_path("scripts")
    if scripts and scripts not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = os.pathsep.join([scripts, os.environ.get("PATH", "")])
    # PyTorch rebuilds when the source or the flags change, not when a header does, nor when the
    # cache folder is reached from another CPU, on which -march=native code can die of an illegal
    # instruction: the headers' and the CPU's digest go into the flags.
    headers = hashlib.sha256(b"".join(h.read_bytes() for h in sorted(source.parent.parent.glob("*/*.h"))))
    cpu = cpu_identity()
    headers.update(cpu)
    try:
        with build_lock(_build_folder(name)):
            module = cpp_extension.load(
                name=name,
                sources=[str(source)],
                extra_cflags=[
                    "-O3",
                    f"-march={march}",
                    "-fopenmp",
                    "-fno-math-errno",
                    # As PyTorch builds: no floating-point traps, so GCC may evaluate both sides of a
                    # select (a division among them). Without AVX-512's masked instructions it
                    # vectorizes no loop with a branch otherwise: the activations and the softmax ran
                    # scalar on AVX2 CPUs, 3x slower than PyTorch (BENCHMARKS.md).
                    "-fno-trapping-math",
                    f"-DATTNLAB_BUILD={headers.hexdigest()[:16]}",
                    *vector_width_flags(cpu, march),
                ],
                extra_ldflags=["-fopenmp"],
                verbose=False,
            )
    except Exception as e:  # no compiler, no ninja, a build error: the caller uses PyTorch instead
        warnings.warn(f"the {what} could not be built ({type(e).__name__}: {e}); {fallback}", stacklevel=3)
        return None
    library = getattr(module, "__file__", None)
    marker = _marker(name, source, march) if library else None
    if marker is not None and not marker.exists():
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(f"{library}\n")
    return module


@contextlib.contextmanager
def build_lock(folder: Path | None):
    """Hold the build folder's lock while PyTorch builds or loads there, and clear the lock file a
    dead build left behind.

    PyTorch marks a build in progress with a file (`folder/lock`) that the builder removes when it
    ends; a builder that was killed (SIGKILL, a machine stopped mid-build) leaves it, and every
    later build of that name then waits for it forever. The operating system's lock taken here
    (flock) ends with its process instead, so whoever holds it knows that a `lock` file it finds
    is left over from a build that no longer runs."""
    try:
        import fcntl
    except ImportError:  # not POSIX: PyTorch's file alone
        fcntl = None
    if folder is None or fcntl is None:
        yield
        return
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "attnlab.lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # released on close, or by the system when this process dies
        left = folder / "lock"
        if left.exists():
            warnings.warn(f"removed {left}, left by a build that did not finish; building again", stacklevel=3)
            left.unlink(missing_ok=True)
        yield


def _build_folder(name: str) -> Path | None:
    """Where PyTorch builds and caches the extension `name` (None where that cannot be found)."""
    from torch.utils import cpp_extension

    try:
        return Path(cpp_extension._get_build_directory(name, verbose=False))
    except Exception:  # a private helper of PyTorch's
        return None


def is_built(name: str, source: Path, march: str = "native") -> bool:
    """Whether `build(name, source, march=march)` would load a finished build from the cache rather
    than compile: a build of these sources, headers and flags, on this CPU, with this PyTorch,
    finished here before (and its library is still there)."""
    marker = _marker(name, source, march)
    if marker is None or not marker.is_file():
        return False
    return Path(marker.read_text().strip()).is_file()


def _marker(name: str, source: Path, march: str) -> Path | None:
    """The file that records a finished build of `source` as it is now, in PyTorch's extension
    cache (None where that cache cannot be located)."""
    import torch

    digest = hashlib.sha256()
    for path in [source, *sorted(source.parent.parent.glob("*/*.h"))]:
        digest.update(path.read_bytes())
    digest.update(cpu_identity())
    digest.update(f"{march} {torch.__version__} {sysconfig.get_python_version()}".encode())
    folder = _build_folder(name)  # without it, nothing counts as built
    return folder / f"attnlab-built-{digest.hexdigest()[:24]}" if folder is not None else None


def vector_width_flags(cpu: bytes, march: str) -> list[str]:
    """GCC's -mprefer-vector-width=256 for a native build on an x86 CPU with AVX2 but not AVX-512
    (`cpu` as cpu_identity gives it), else nothing.

    GCC tunes for the CPU it detects, and on the AVX2 AMD EPYC machines this project runs on it has
    detected Zen 1 (znver1): that tuning vectorizes loops 4 floats wide, as Zen 1 split 8-float
    operations in two. Later Zen cores do not, and the kernels' loops (the activation, LayerNorm,
    the softmax's exp) ran 8 wide ~10% faster there (BENCHMARKS.md). The kernels' explicit vectors
    are as wide as the registers either way; on AVX-512 CPUs GCC's tunings pick their own width."""
    words = cpu.decode(errors="replace").split()
    if march != "native" or "avx2" not in words or "avx512f" in words:
        return []
    return ["-mprefer-vector-width=256"]


def cpu_identity() -> bytes:
    """The CPU's model and instruction-set flags as the system lists them (Linux's /proc/cpuinfo),
    or the machine's architecture where it lists none."""
    lines = cpuinfo_lines(("model name", "flags", "Features", "CPU part"))  # x86's names, and Arm's
    return "\n".join(lines).encode() or platform.machine().encode()
