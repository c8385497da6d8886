"""Building attnlab's C++ sources with PyTorch's extension tools.

A build takes about a minute and is cached afterwards (under `TORCH_EXTENSIONS_DIR`, by default
~/.cache/torch_extensions); the code that uses one falls back to PyTorch's operators, with a
warning, where it cannot be built (no compiler, no ninja). `attnlab kernels build` (which `make`
runs when it installs attnlab) builds them ahead of time; `is_built` then says so without building,
which is how the defaults (`"auto"`) take the kernels only when using them costs no pause.

Each build has a folder of its own, named by a digest of everything the library depends on: the
sources and headers, the compiler flags, the CPU, PyTorch's and Python's versions, and the
installation (the source folder and the environment's prefix). PyTorch keys its folder by the
extension's name alone, so two checkouts or two virtual environments on one machine rewrote each
other's `build.ninja` and took turns recompiling; with the digest in the name they keep their own
builds side by side. A build killed halfway does not stop later ones (`build_lock`).

`ATTNLAB_MARCH` names the instruction set to build for (GCC's -march, `native` by default):
`x86-64-v3` builds the AVX2 code paths on a CPU that has AVX-512, which is how the test suite
checks them (`make test-avx2`).
"""

import contextlib
import hashlib
import os
import platform
import sys
import sysconfig
import warnings
from pathlib import Path
from types import ModuleType

from attnlab.device import cpuinfo_lines

MARCH_VARIABLE = "ATTNLAB_MARCH"

PATH_ADDED: str | None = None
"""The folder `build` put at the front of this process's PATH so that ninja is found (None: none).
The user's shell lacks it: `attnlab demo` leaves it out when it says how to reach the command."""


def default_march() -> str:
    """The instruction set builds target: `ATTNLAB_MARCH` where set, else this CPU's (`native`)."""
    return os.environ.get(MARCH_VARIABLE, "").strip() or "native"


def build(name: str, source: Path, *, what: str, fallback: str, march: str | None = None) -> ModuleType | None:
    """The extension `name` compiled from `source` (and the headers beside it) for the instruction
    set `march` (GCC's -march; `default_march()` when None), or None with a warning "the {what}
    could not be built (...); {fallback}"."""
    from torch.utils import cpp_extension

    # The build runs `ninja`, which the `ninja` package installs beside this interpreter: on PATH
    # only in an activated environment.
    global PATH_ADDED
    scripts = sysconfig.get_path("scripts")
    if scripts and scripts not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = os.pathsep.join([scripts, os.environ.get("PATH", "")])
        PATH_ADDED = scripts
    march = march or default_march()
    flags = compiler_flags(march)
    folder = build_folder(name, source, march)
    try:
        with build_lock(folder):
            module = cpp_extension.load(
                name=folder.name,
                sources=[str(source)],
                extra_cflags=flags,
                extra_ldflags=["-fopenmp"],
                build_directory=str(folder),
                verbose=False,
            )
    except Exception as e:  # no compiler, no ninja, a build error: the caller uses PyTorch instead
        warnings.warn(f"the {what} could not be built ({type(e).__name__}: {e}); {fallback}", stacklevel=3)
        return None
    library = getattr(module, "__file__", None)
    marker = folder / BUILT
    if library and not marker.exists():
        marker.write_text(f"{library}\n")
    return module


BUILT = "attnlab-built"
"""The file a finished build leaves in its folder: the library's path (a killed link can leave a
partial library behind, never this file)."""


def compiler_flags(march: str) -> list[str]:
    """GCC's flags for a build for the instruction set `march` on this CPU."""
    return [
        "-O3",
        f"-march={march}",
        "-fopenmp",
        "-fno-math-errno",
        # As PyTorch builds: no floating-point traps, so GCC may evaluate both sides of a select (a
        # division among them). Without AVX-512's masked instructions it vectorizes no loop with a
        # branch otherwise, and the activations and the softmax ran scalar on AVX2 CPUs.
        "-fno-trapping-math",
        *vector_width_flags(cpu_identity(), march),
    ]


def build_folder(name: str, source: Path, march: str | None = None) -> Path:
    """Where the build of `name` from `source` for `march` lives: `TORCH_EXTENSIONS_DIR` (or
    PyTorch's default root) / `{name}_{digest}`, the digest covering the sources and headers, the
    flags, the CPU, PyTorch's and Python's versions and the installation."""
    import torch
    from torch.utils import cpp_extension

    march = march or default_march()
    digest = hashlib.sha256()
    for path in [source, *sorted(source.parent.parent.glob("*/*.h"))]:
        digest.update(path.read_bytes())
    digest.update("\0".join(compiler_flags(march)).encode())
    digest.update(cpu_identity())
    digest.update(f"{torch.__version__} {sysconfig.get_python_version()}".encode())
    # The installation: the ninja file names the source by its path, and the library links
    # against this environment's PyTorch.
    digest.update(f"{source.resolve()} {sys.prefix}".encode())
    root = os.environ.get("TORCH_EXTENSIONS_DIR") or cpp_extension.get_default_build_root()
    return Path(root) / f"{name}_{digest.hexdigest()[:16]}"


def is_built(name: str, source: Path, march: str | None = None) -> bool:
    """Whether `build(name, source, march=march)` would load a finished build rather than compile:
    a build of these sources, headers and flags, on this CPU, with this PyTorch, from this
    installation, finished before (and its library is still there)."""
    marker = build_folder(name, source, march) / BUILT
    return marker.is_file() and Path(marker.read_text().strip()).is_file()


@contextlib.contextmanager
def build_lock(folder: Path):
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
    if fcntl is None:
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


def vector_width_flags(cpu: bytes, march: str) -> list[str]:
    """GCC's -mprefer-vector-width=256 for a native build on an x86 CPU with AVX2 but not AVX-512
    (`cpu` as cpu_identity gives it), else nothing.

    GCC tunes for the CPU it detects, and on some AVX2 machines it detects an early core whose
    tuning vectorizes loops 4 floats wide (that core split 8-float operations in two). Later
    cores do not, and the kernels' loops (the activation, LayerNorm, the softmax's exp) ran
    faster 8 wide there (BENCHMARKS.md, "Tuned CPU paths"). The kernels' explicit vectors are
    as wide as the registers either way; on AVX-512 CPUs GCC's tunings pick their own width."""
    words = cpu.decode(errors="replace").split()
    if march != "native" or "avx2" not in words or "avx512f" in words:
        return []
    return ["-mprefer-vector-width=256"]


def cpu_identity() -> bytes:
    """The CPU's model and instruction-set flags as the system lists them (Linux's /proc/cpuinfo),
    or the machine's architecture where it lists none."""
    lines = cpuinfo_lines(("model name", "flags", "Features", "CPU part"))  # x86's names, and Arm's
    return "\n".join(lines).encode() or platform.machine().encode()
