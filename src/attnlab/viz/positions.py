"""The sinusoidal position table as a picture, and why it encodes relative position.

Left: the table PE `(n, d)` of Vaswani et al. (2017) §3.5 as a heatmap, positions down, dimensions
across: fast sines at the left, slower and slower towards the right. Right: the dot product
PE[p] · PE[p + k] against the offset k for a few starting positions p. Each column pair is a
rotation at frequency ω_i, so PE[p] · PE[p + k] = Σ_i cos(k ω_i): one curve, whatever p; the lines
lie on top of each other.

References: Vaswani et al. (2017) §3.5; Kazemnejad, "Transformer Architecture: The Positional
Encoding" (2019), the dot-product-versus-offset picture.
"""

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from attnlab.viz.figure import check_png_path, new_figure, png_size, save_png

WIDTH_IN, HEIGHT_IN = 11.0, 4.2  # saved at exactly this size (no tight cropping): 1650 × 630 px at 150 dpi


@dataclass(frozen=True)
class PositionsPlot:
    """What `plot_positions` drew.

    table: the sinusoidal table `(n, d_model)`, float32, as drawn in the left panel.
    offsets: the offsets k `(K,)` of the right panel.
    dots: for each starting position p, PE[p] · PE[p + k] for every k in `offsets`, `(K,)` float64.
    size: (width, height) of the saved PNG in pixels.
    """

    path: Path
    table: np.ndarray
    offsets: np.ndarray
    dots: dict[int, np.ndarray]
    size: tuple[int, int]


def plot_positions(d_model: int, n_positions: int, path: str | Path) -> PositionsPlot:
    """Save the sinusoidal table `(n_positions, d_model)` and its dot products against the offset as
    a two-panel PNG at `path`; return what was drawn. Raises `UserError` for a bad path, `ValueError`
    when d_model or n_positions is below 2."""
    from attnlab.nn.positions import sinusoidal_positions

    path = check_png_path(path)
    if d_model < 2 or n_positions < 2:
        raise ValueError(f"need d_model >= 2 and n_positions >= 2, got {d_model} and {n_positions}")
    table = sinusoidal_positions(n_positions, d_model).numpy()  # (n, d)
    starts = sorted({0, n_positions // 4, n_positions // 2})
    offsets = np.arange(n_positions - starts[-1])  # every start has a partner p + k for each k
    rows = table.astype(np.float64)
    dots = {p: rows[p + offsets] @ rows[p] for p in starts}  # (K,) per start

    fig = new_figure(WIDTH_IN, HEIGHT_IN)
    left, right = fig.subplots(1, 2, width_ratios=[1.15, 1])
    image = left.imshow(table, cmap="RdBu", vmin=-1, vmax=1, aspect="auto", interpolation="nearest")
    left.set_xlabel("dimension")
    left.set_ylabel("position")
    left.set_title(f"sinusoidal positions PE ({n_positions} × {d_model})")
    fig.colorbar(image, ax=left, shrink=0.9)
    for p, dot in dots.items():
        # Later lines dashed and thinner, so the ones underneath still show where they coincide.
        style = {"linewidth": 2.4, "linestyle": "-"} if p == starts[0] else {"linewidth": 1.2, "linestyle": "--"}
        right.plot(offsets, dot, label=f"p = {p}", **style)
    right.set_xlabel("offset k")
    right.set_ylabel("PE[p] · PE[p + k]")
    right.set_title("dot product depends on the offset only")
    right.grid(alpha=0.3)
    right.legend(fontsize=8)
    save_png(fig, path, tight=False)
    return PositionsPlot(path, table, offsets, dots, png_size(path))
