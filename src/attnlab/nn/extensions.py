"""Building attnlab's C++ sources with PyTorch's extension tools, on first use.

A build takes about a minute and is cached afterwards (in `TORCH_EXTENSIONS_DIR`, by default
~/.cache/torch_extensions); the code that uses one falls back to PyTorch's operators, with a
warning, where it cannot be built (no compiler, no ninja).
"""

import hashlib
import os
import sysconfig
import warnings
from pathlib import Path
from types import ModuleType


def build(name: str, source: Path, *, what: str, fallback: str) -> ModuleType | None:
    """The extension `name` compiled from `source` (and the headers beside it), or None with a
    warning "the {what} could not be built (...); {fallback}"."""
    from torch.utils import cpp_extension

    # The build runs `ninja`, which the `ninja` package installs beside this interpreter: on PATH
    # only in an activated environment.
    scripts = sysconfig.get_path("scripts")
    if scripts and scripts not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = os.pathsep.join([scripts, os.environ.get("PATH", "")])
    # PyTorch rebuilds when the source or the flags change, not when a header does: the headers'
    # digest goes into the flags.
    headers = hashlib.sha256(b"".join(h.read_bytes() for h in sorted(source.parent.parent.glob("*/*.h"))))
    try:
        return cpp_extension.load(
            name=name,
            sources=[str(source)],
            extra_cflags=[
                "-O3",
                "-march=native",
                "-fopenmp",
                "-fno-math-errno",
                f"-DATTNLAB_HEADERS={headers.hexdigest()[:16]}",
            ],
            extra_ldflags=["-fopenmp"],
            verbose=False,
        )
    except Exception as e:  # no compiler, no ninja, a build error: the caller uses PyTorch instead
        warnings.warn(f"the {what} could not be built ({type(e).__name__}: {e}); {fallback}", stacklevel=3)
        return None
