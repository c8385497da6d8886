"""What every attnlab picture shares: a bare matplotlib `Figure` on the Agg canvas (no pyplot, no
global backend, works without a display), PNG paths checked before any work, atomic saving, and
PNG bytes for pages that inline their pictures."""

import base64
import io
import struct
from pathlib import Path

from attnlab.errors import UserError
from attnlab.fileio import atomic_write

DPI = 150
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def new_figure(width: float, height: float):
    """A matplotlib `Figure` of `width` × `height` inches, or a `UserError` that says how to install it."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as e:
        raise UserError("drawing pictures needs matplotlib: pip install 'attnlab[plot]'") from e
    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def save_png(fig, path: Path, *, tight: bool = True) -> None:
    """Write `fig` to `path` atomically. `tight` crops to what was drawn (pictures sized by their
    tokens); `tight=False` keeps the figure's own size, exactly width × height inches at `DPI`."""
    # The temporary file does not end in .png, so the format is named explicitly.
    atomic_write(path, lambda tmp: tmp.write_bytes(png_bytes(fig, tight=tight)))


def png_bytes(fig, *, tight: bool = True) -> bytes:
    """`fig` encoded as PNG (see `save_png` for `tight`)."""
    buffer = io.BytesIO()
    crop = {"bbox_inches": "tight", "pad_inches": 0.1} if tight else {}
    fig.savefig(buffer, format="png", dpi=DPI, **crop)
    return buffer.getvalue()


def png_data_uri(png: bytes) -> str:
    """A `data:image/png;base64,...` URI: a picture inside an HTML page, with no file beside it."""
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def png_size(png: bytes | Path) -> tuple[int, int]:
    """(width, height) in pixels of a PNG file or its bytes, read from the IHDR chunk that the PNG
    specification puts first; a `ValueError` when the data is not a PNG."""
    data = png.read_bytes()[:24] if isinstance(png, Path) else png[:24]
    if data[:8] != PNG_SIGNATURE or data[12:16] != b"IHDR":
        raise ValueError("not a PNG image (no PNG signature and IHDR chunk at the start)")
    return struct.unpack(">II", data[16:24])


def check_png_path(path: str | Path) -> Path:
    """`path` as a Path, or a `UserError` when it does not end in .png or its folder is missing."""
    return check_output_path(path, (".png",), "pictures are saved as PNG")


def check_output_path(path: str | Path, suffixes: tuple[str, ...], what: str) -> Path:
    """`path` as a Path, checked before any work: a `UserError` when its suffix is not one of
    `suffixes` (`what` says why, e.g. "pictures are saved as PNG") or its folder is missing."""
    path = Path(path)
    if path.suffix.lower() not in suffixes:
        raise UserError(f"{path}: {what}; give a path ending in {' or '.join(suffixes)}")
    if not path.parent.is_dir():
        raise UserError(f"{path.parent} is not an existing folder; create it first, or save elsewhere")
    return path
