"""File I/O helpers: atomic writes, and UTF-8 decoding that says where a bad byte is.

Atomic writes go through a temporary file beside the target, fsync, rename, fsync the folder: a
process killed at any moment leaves either the old file or the new one, never half of one.
"""

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from attnlab.errors import UserError


def decode_utf8(raw: bytes, where: str, *, bom: bool = False) -> str:
    """raw as UTF-8 text (dropping a leading byte-order mark when `bom`); a bad byte is a UserError
    naming `where`, the line and the column. Example: b"ok\n\xff" from "a.txt" -> "a.txt:2 is not UTF-8 ..."."""
    try:
        return raw.decode("utf-8-sig" if bom else "utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        column = e.start - (raw.rfind(b"\n", 0, e.start) + 1) + 1
        raise UserError(
            f"{where}:{line} is not UTF-8 (byte 0x{raw[e.start]:02x} at line {line}, column {column}); "
            "convert it to UTF-8"
        ) from None


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


def atomic_link(source: Path, path: Path) -> None:
    """Make `path` the same file as `source` (a hard link: no copy; a copy where the file system
    has no hard links), replacing whatever `path` was in one atomic rename."""

    def link(tmp: Path) -> None:
        tmp.unlink(missing_ok=True)  # a stale temporary (same pid, earlier crash) may be another file's link
        try:
            os.link(source, tmp)
        except OSError:
            shutil.copyfile(source, tmp)

    atomic_write(path, link)


def check_writable(path: Path) -> None:
    """A `UserError` now, before minutes of work, when `path` could not be written: its folder is
    missing, or a file cannot be created there (tried for real: permission bits say nothing to root)."""
    path = Path(path)
    if not path.parent.is_dir():
        raise UserError(f"{path.parent} is not an existing folder; create it first, or save elsewhere")
    try:
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}.probe-"):
            pass
    except OSError as e:
        raise UserError(f"cannot write {path}: {e.strerror}; choose another --out") from None


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
