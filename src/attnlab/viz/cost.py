"""Log–log plots of `attnlab cost`: measured cost against t for each model measured, each line labelled
with its fitted exponent beside the theory's, a dotted line of the theory's slope through the
longest measured point, and the lengths the fit used shaded."""

from pathlib import Path

from attnlab.studies.cost import MODEL_LABELS, QUANTITY_LABELS, CostResult
from attnlab.viz.figure import DPI, check_png_path, new_figure, save_png

PANEL_IN = (4.6, 3.4)
"""Width and height of one panel in inches; a picture of n panels is about n·4.6 × 3.4 inches at
`DPI` (the tight bounding box trims or adds a few pixels)."""
COLORS = {
    "rnn": "tab:blue",
    "rnn-attention": "tab:orange",
    "transformer": "tab:green",
    "transformer-window": "tab:red",
    "transformer-bigbird": "tab:purple",
}
UNITS = {"time": "seconds", "memory": "peak MiB above the model"}

PLOTS = {
    "cost_time.png": ("train_time",),
    "cost_memory.png": ("train_memory",),
    "cost_generate.png": ("generate_time", "generate_memory"),
}
"""File name -> the quantities drawn in it, one panel each."""


def nominal_size(n_panels: int) -> tuple[int, int]:
    """(width, height) in pixels of a picture of `n_panels` panels before the tight bounding box."""
    return round(n_panels * PANEL_IN[0] * DPI), round(PANEL_IN[1] * DPI)


def plot_quantities(result: CostResult, quantities: tuple[str, ...], path: str | Path) -> Path:
    """One log–log panel per quantity ("train_time", "generate_memory", ...) of `result`, saved as a
    PNG at `path`. Lengths a model could not run (None) are left out of its line."""
    path = check_png_path(path)
    fig = new_figure(PANEL_IN[0] * len(quantities), PANEL_IN[1])
    axes = fig.subplots(1, len(quantities), squeeze=False)[0]
    rows = {(r.model, r.quantity): r for r in result.table}
    fit = result.fit_lengths
    for ax, quantity in zip(axes, quantities, strict=True):
        ax.axvspan(fit[0], fit[-1], color="0.93", zorder=0, label=f"fitted on t = {fit[0]}..{fit[-1]}")
        for model in result.models:
            points = [(t, v) for t, v in zip(result.lengths, result.series(model, quantity), strict=True) if v]
            if not points:
                continue
            row = rows[(model, quantity)]
            fitted = "-" if row.fitted_exponent is None else f"{row.fitted_exponent:.2f}"
            xs, ys = zip(*points, strict=True)
            ax.plot(
                xs,
                ys,
                marker="o",
                markersize=3,
                color=COLORS[model],
                label=f"{MODEL_LABELS[model]}: {fitted} (theory {row.theory_exponent})",
            )
            # The theory's slope through the longest measured point, across the fitted lengths.
            t_end, v_end = points[-1]
            ax.plot(
                [fit[0], t_end],
                [v_end * (fit[0] / t_end) ** row.theory_exponent, v_end],
                linestyle=":",
                color=COLORS[model],
                linewidth=1,
            )
        ax.set_xscale("log", base=2)
        ax.set_xticks(result.lengths, [str(t) for t in result.lengths], fontsize=7)
        ax.minorticks_off()
        ax.set_yscale("log")
        ax.set_xlabel("sequence length t")
        ax.set_ylabel(UNITS[quantity.split("_")[1]])
        ax.set_title(f"{QUANTITY_LABELS[quantity]}, k={result.width} d={result.layers}", fontsize=9)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7, title="exponent of t", title_fontsize=7)
    save_png(fig, path)
    return path


def plot_cost(result: CostResult, folder: str | Path) -> list[Path]:
    """Every picture of `PLOTS` into `folder`: cost_time.png (training step time), cost_memory.png
    (training step memory), cost_generate.png (generation time and memory). Returns their paths."""
    return [plot_quantities(result, quantities, Path(folder) / name) for name, quantities in PLOTS.items()]
