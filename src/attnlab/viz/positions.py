"""The sinusoidal position table as a picture, and why it encodes relative position.

Left: the table PE `(n, d)` of Vaswani et al. (2017) §3.5 as a heatmap, positions down, dimensions
across: fast sines at the left, slower and slower towards the right. Right: the dot product
PE[p] · PE[p + k] against the offset k for a few starting positions p. Each column pair is a
rotation at frequency ω_i, so PE[p] · PE[p + k] = Σ_i cos(k ω_i): one curve, whatever p; the lines
lie on top of each other.

References: Vaswani et al. (2017) §3.5; Kazemnejad, "Transformer Architecture: The Positional
Encoding" (2019), the dot-product-versus-offset picture.
"""

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from attnlab.names import DRAWN_SCHEMES
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


# ---------------------------------------------------------------------------------------------
# The other schemes, one two-panel picture each: what the scheme is (left), and what attention
# sees of it against the offset between a query and a key (right).


@dataclass(frozen=True)
class SchemePlot:
    """What `plot_scheme` drew. heatmap: the left panel's matrix; offsets `(K,)` and curves (one
    `(K,)` array per label): the right panel; size: the PNG's (width, height) in pixels."""

    path: Path
    kind: str
    heatmap: np.ndarray
    offsets: np.ndarray
    curves: dict[str, np.ndarray]
    size: tuple[int, int]
    n_positions: int


@dataclass(frozen=True)
class _Panels:
    heatmap: np.ndarray
    heatmap_title: str
    heatmap_labels: tuple[str, str]
    offsets: np.ndarray
    curves: dict[str, np.ndarray]
    curve_title: str
    curve_labels: tuple[str, str]
    symmetric: bool = True  # the heatmap's colour scale centred on zero


def _fourier(d_model: int, n: int, shift: int) -> _Panels:
    """The lecture's basis, and the scores e_s · R(d) e_t of a query at t whose W_Q is the shift R(d)."""
    from attnlab.nn.positions import fourier_positions, fourier_shift

    table = fourier_positions(n, d_model, n).double().numpy()  # (n, d)
    queries = table @ fourier_shift(shift, d_model, n).double().numpy().T  # row t: R(d) e_t = e_{t-d}
    ts = sorted({n - 1, n // 2, max(shift, n // 4)})
    keys = np.arange(n)
    curves = {f"query at t = {t}": table @ queries[t] for t in ts}  # peaks at key t - d
    return _Panels(
        table,
        f"Fourier basis e_t (T = {n}, {d_model} dims)",
        ("dimension", "position t"),
        keys,
        curves,
        f"scores e_s · R({shift}) e_t: each query finds the key {shift} back",
        ("key position s", "score"),
    )


def _alibi(n_heads: int, n: int) -> _Panels:
    """Each head's penalty −m·(i − j) on the scores (causal), and its slope against the distance."""
    from attnlab.nn.positions import alibi_slopes

    slopes = alibi_slopes(n_heads).double().numpy()
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    first = np.where(j <= i, -slopes[0] * (i - j), np.nan)  # the steepest head, future masked
    offsets = np.arange(n)
    curves = {f"head {h + 1}: m = {m:.4g}": -m * offsets for h, m in enumerate(slopes)}
    return _Panels(
        first,
        f"ALiBi bias of head 1 (m = {slopes[0]:.4g})",
        ("key j", "query i"),
        offsets,
        curves,
        f"bias −m·(i − j) per head ({n_heads} heads)",
        ("distance i − j", "bias on the score"),
        symmetric=False,
    )


def _rope(d_model: int, n: int) -> _Panels:
    """cos of each pair's angle p·θ_i, and ⟨R(p) q, R(p + k) q⟩ for q = (1, …, 1) from several p."""
    import torch

    from attnlab.nn.positions import rope_angles, rope_rotate

    positions = torch.arange(n)
    angles = rope_angles(positions, d_model)  # (n, d/2)
    ones = torch.ones(1, n, d_model, dtype=torch.float64)
    rotated = rope_rotate(ones, angles.double())[0].numpy()  # (n, d): R(p) q for every p
    starts = sorted({0, n // 4, n // 2})
    offsets = np.arange(n - starts[-1])
    curves = {f"p = {p}": rotated[p + offsets] @ rotated[p] for p in starts}
    return _Panels(
        angles.cos().double().numpy(),
        f"RoPE: cos(p·θ_i), {d_model // 2} pairs",
        ("pair i", "position p"),
        offsets,
        curves,
        "⟨R(p) q, R(p + k) q⟩, q = 1: the offset alone, decaying",
        ("offset k", "dot product"),
    )


def _relative(max_distance: int, n: int) -> _Panels:
    """Which of Shaw et al.'s 2k + 1 vectors each (query, key) pair reads: clip(j − i, −k, k)."""
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    index = np.clip(j - i, -max_distance, max_distance).astype(np.float64)
    offsets = np.arange(-n + 1, n)
    curves = {f"k = {max_distance}": np.clip(offsets, -max_distance, max_distance).astype(np.float64)}
    return _Panels(
        index,
        f"relative positions: clip(j − i, ±{max_distance})",
        ("key j", "query i"),
        offsets,
        curves,
        "the vector a_(j−i) used, by offset",
        ("offset j − i", "clipped offset"),
    )


@dataclass(frozen=True)
class _Settings:
    d_model: int
    n_positions: int
    n_heads: int
    shift: int
    max_distance: int


PANELS: dict[str, Callable[[_Settings], _Panels]] = {
    "fourier": lambda s: _fourier(s.d_model, s.n_positions, s.shift),
    "alibi": lambda s: _alibi(s.n_heads, s.n_positions),
    "rope": lambda s: _rope(s.d_model, s.n_positions),
    "relative": lambda s: _relative(s.max_distance, s.n_positions),
}
"""The two panels of each scheme `plot_scheme` draws: every drawn scheme of `attnlab.names.POSITION_SCHEMES`
but sinusoidal, which `plot_positions` draws."""

SCHEMES_DRAWN = DRAWN_SCHEMES
"""What `attnlab positions --kind` takes, from the one list of position schemes."""


def plot_scheme(
    kind: str,
    path: str | Path,
    *,
    d_model: int = 64,
    n_positions: int = 64,
    n_heads: int = 8,
    shift: int = 3,
    max_distance: int = 8,
) -> SchemePlot:
    """Draw position scheme `kind` (one of SCHEMES_DRAWN but sinusoidal, which `plot_positions`
    draws) as a two-panel PNG at `path`; return what was drawn."""
    path = check_png_path(path)
    if kind not in PANELS:
        raise ValueError(f"kind must be one of {sorted(PANELS)}, got {kind!r}")
    panels = PANELS[kind](_Settings(d_model, n_positions, n_heads, shift, max_distance))
    fig = new_figure(WIDTH_IN, HEIGHT_IN)
    left, right = fig.subplots(1, 2, width_ratios=[1.15, 1])
    bound = float(np.nanmax(np.abs(panels.heatmap)))
    scale = {"vmin": -bound, "vmax": bound, "cmap": "RdBu"} if panels.symmetric else {"cmap": "viridis"}
    image = left.imshow(panels.heatmap, aspect="auto", interpolation="nearest", **scale)
    left.set_xlabel(panels.heatmap_labels[0])
    left.set_ylabel(panels.heatmap_labels[1])
    left.set_title(panels.heatmap_title)
    fig.colorbar(image, ax=left, shrink=0.9)
    for n, (label, curve) in enumerate(panels.curves.items()):
        style = {"linewidth": 2.4} if n == 0 else {"linewidth": 1.2, "linestyle": "--"}
        right.plot(panels.offsets, curve, label=label, **style)
    right.set_xlabel(panels.curve_labels[0])
    right.set_ylabel(panels.curve_labels[1])
    right.set_title(panels.curve_title, fontsize=9)
    right.grid(alpha=0.3)
    right.legend(fontsize=7, ncol=2 if len(panels.curves) > 4 else 1)
    save_png(fig, path, tight=False)
    return SchemePlot(path, kind, panels.heatmap, panels.offsets, panels.curves, png_size(path), n_positions)


def draw_positions(
    kind: str,
    path: str | Path,
    *,
    d_model: int | None = None,
    n_positions: int | None = None,
    n_heads: int = 8,
    shift: int = 3,
    max_distance: int = 8,
) -> PositionsPlot | SchemePlot:
    """`attnlab positions`: any scheme of SCHEMES_DRAWN as a two-panel PNG at `path`, the arguments
    checked first (`UserError`). The defaults: sinusoidal 128 wide over 100 positions (its
    picture, `plot_positions`), the others 64 wide over 64 positions (`plot_scheme`)."""
    from attnlab.config import close_matches
    from attnlab.errors import UserError

    if kind not in SCHEMES_DRAWN:
        choices = ", ".join(SCHEMES_DRAWN)
        raise UserError(f"unknown --kind {kind!r}{close_matches(kind, SCHEMES_DRAWN)}; choose one of {choices}")
    sinusoidal = kind == "sinusoidal"
    d_model = d_model or (128 if sinusoidal else 64)
    n = n_positions or (100 if sinusoidal else 64)
    if d_model < 2 or n < 2:
        raise UserError(f"--d-model and --n must be >= 2, got {d_model} and {n}")
    if kind in ("fourier", "rope") and d_model % 2:
        raise UserError(f"--kind {kind} pairs its dimensions: --d-model must be even, got {d_model}")
    if kind == "fourier" and shift >= n:
        raise UserError(f"--shift {shift} must be below --n {n}, or no query has a key that far back")
    if sinusoidal:
        return plot_positions(d_model, n, path)
    return plot_scheme(
        kind, path, d_model=d_model, n_positions=n, n_heads=n_heads, shift=shift, max_distance=max_distance
    )
