"""Atomic file writes: a temporary file beside the target, fsync, rename, fsync the folder.

A process killed at any moment leaves either the old file or the new one, never half of one.
"""

import os
from collections.abc import Callable
from pathlib import Path


def atomic_write_bytes(path: Path, data: bytes) -> None:
    atomic_write(path, lambda tmp: tmp.write_bytes(data))


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write(path: Path, write: Callable[[Path], object]) -> None:
    """Call `write(tmp_path)` to produce the file, then move it into place atomically."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        write(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    fsync_dir(path.parent)


def fsync_dir(folder: Path) -> None:
    """Make a rename durable: fsync the folder that holds it (a no-op where unsupported)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
