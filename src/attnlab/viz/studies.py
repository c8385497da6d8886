"""Pictures of the studies: an ablation's validation-loss curves, one line per variant (the mean
over its seeds), and a scaling ladder's loss against parameters on log-log axes with the fitted
power laws, beside its loss-against-compute curves."""

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from attnlab.studies.scaling import KAPLAN_ALPHA_N, ScaleResult
from attnlab.viz.figure import check_png_path, new_figure, save_png


def plot_ablation_curves(
    curves: Mapping[str, tuple[Sequence[int], Sequence[float]]], path: str | Path, *, title: str = ""
) -> Path:
    """Validation loss against the step, one line per variant (`curves`: variant -> (steps,
    mean loss)); the first quarter of training, where the losses fall fastest, on its own panel
    would hide the end, so the y-axis starts at the curves' values after that quarter."""
    path = check_png_path(path)
    fig = new_figure(7.0, 4.2)
    ax = fig.subplots()
    colors = _colors(len(curves))
    for (name, (steps, losses)), color in zip(curves.items(), colors, strict=True):
        ax.plot(steps, losses, marker="o", markersize=2.5, linewidth=1.2, color=color, label=name)
    tails = [v for steps, losses in curves.values() for s, v in zip(steps, losses, strict=True) if s >= max(steps) / 4]
    if tails:
        low, high = min(tails), max(tails)
        ax.set_ylim(low - 0.05 * (high - low + 1e-9), high + 0.05 * (high - low + 1e-9))
    ax.set_xlabel("step")
    ax.set_ylabel("validation loss (mean over seeds)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2 if len(curves) > 8 else 1, loc="upper right")
    if title:
        ax.set_title(title, fontsize=10)
    save_png(fig, path)
    return path


def _colors(n: int) -> list:
    from matplotlib import colormaps

    cmap = colormaps["tab20" if n > 10 else "tab10"]
    return [cmap(i % cmap.N) for i in range(n)]


def plot_scaling(result: ScaleResult, path: str | Path) -> Path:
    """Left: validation loss against non-embedding parameters N on log-log axes, the ladder's
    points and both fitted laws (the chosen one solid). Right: each size's validation loss against
    training compute C = 6 N D, with the compute-optimal frontier's points."""
    path = check_png_path(path)
    fig = new_figure(10.0, 4.2)
    left, right = fig.subplots(1, 2)
    n = np.array([r.non_embedding_params for r in result.rows], dtype=np.float64)
    loss = np.array([r.val_loss for r in result.rows])
    left.scatter(n, loss, color="black", zorder=3, label="ladder (validation loss)")
    for r in result.rows:
        point = (r.non_embedding_params, r.val_loss)
        left.annotate(r.size, point, fontsize=7, xytext=(4, 4), textcoords="offset points")
    grid = np.geomspace(n.min() / 1.5, n.max() * 1.5, 200)
    chosen = result.chosen
    for fit in result.fits:
        label = f"{fit.law}: α = {fit.alpha:.3f}" + (f", E = {fit.e:.3f}" if fit.n_fitted == 3 else "")
        style = "-" if fit is chosen else "--"
        left.plot(grid, fit.predict(grid), style, linewidth=1.3, label=label + (" (chosen)" if fit is chosen else ""))
    left.set_xscale("log")
    left.set_yscale("log")
    left.set_xlabel("non-embedding parameters N")
    left.set_ylabel("validation loss (nats/token)")
    left.grid(alpha=0.3, which="both")
    left.legend(fontsize=7)
    left.set_title(f"L(N), {result.rows[0].tokens:,} tokens each (Kaplan et al.: α_N = {KAPLAN_ALPHA_N})", fontsize=9)
    for (size, (_, points)), color in zip(result.curves.items(), _colors(len(result.curves)), strict=True):
        if points:
            compute, losses = zip(*points, strict=True)
            right.plot(compute, losses, color=color, linewidth=1.2, label=size)
    if result.frontier:
        right.scatter(
            [p.compute for p in result.frontier],
            [p.loss for p in result.frontier],
            color="black",
            marker="x",
            zorder=3,
            label="compute-optimal (lowest at C)",
        )
    right.set_xscale("log")
    right.set_yscale("log")
    right.set_xlabel("training compute C = 6 N D (FLOPs)")
    right.set_ylabel("validation loss")
    right.grid(alpha=0.3, which="both")
    right.legend(fontsize=7)
    right.set_title("loss along each run", fontsize=9)
    for ax in (left, right):  # plain numbers on the log-scaled loss axis: its range is narrow
        ax.yaxis.set_major_formatter(_plain)
        ax.yaxis.set_minor_formatter(_plain)
    save_png(fig, path)
    return path


def _plain(value: float, _position: int) -> str:
    return f"{value:g}"
