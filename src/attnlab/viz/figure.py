"""What every attnlab picture shares: a bare matplotlib `Figure` on the Agg canvas (no pyplot, no
global backend, works without a display), PNG paths checked before any work, atomic saving."""

from pathlib import Path

from attnlab.errors import UserError
from attnlab.fileio import atomic_write

DPI = 150


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


def save_png(fig, path: Path) -> None:
    # The temporary file does not end in .png, so the format is named explicitly.
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=DPI, bbox_inches="tight", pad_inches=0.1))


def check_png_path(path: str | Path) -> Path:
    """`path` as a Path, or a `UserError` when it does not end in .png or its folder is missing."""
    path = Path(path)
    if path.suffix.lower() != ".png":
        raise UserError(f"{path}: pictures are saved as PNG; give a path ending in .png")
    if not path.parent.is_dir():
        raise UserError(f"{path.parent} is not an existing folder; create it first, or save elsewhere")
    return path
