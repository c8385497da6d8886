"""Training curves from a run's metrics.csv: one panel per metric, one line per run (`plot_curves`),
or everything one run logged (`plot_run`, what `attnlab plot` draws)."""

import csv
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from attnlab.errors import UserError
from attnlab.viz.figure import check_png_path, new_figure, save_png

LABELS = {
    "train_loss": "training loss",
    "val_loss": "validation loss",
    "val_bleu": "validation BLEU",
    "val_accuracy": "validation accuracy",
    "val_ppl": "validation perplexity",
    "lr": "learning rate",
    "tokens_per_sec": "tokens / s",
}

# The panels of `plot_run`: a title and the columns drawn in it, each from the rows of one kind
# ("train" rows are logged every log_interval steps, "eval" rows every eval_interval; None: any row).
RUN_PANELS: tuple[tuple[str, tuple[tuple[str, str | None], ...]], ...] = (
    ("loss", (("train_loss", "train"), ("val_loss", "eval"))),
    ("validation BLEU", (("val_bleu", "eval"),)),
    ("validation accuracy", (("val_accuracy", "eval"),)),
    ("validation perplexity", (("val_ppl", "eval"),)),
    ("learning rate", (("lr", None),)),
    ("throughput (tokens / s)", (("tokens_per_sec", "train"),)),
)


def read_metrics(run_dir: str | Path) -> list[dict[str, str]]:
    """The rows of a run's metrics.csv as written (strings; an empty string where a row has no value)."""
    path = Path(run_dir) / "metrics.csv"
    try:
        with open(path, newline="") as f:
            return list(csv.DictReader(f))
    except FileNotFoundError:
        raise UserError(f"{path} does not exist; give a run folder written by `attnlab train`") from None


def read_metric(run_dir: str | Path, metric: str) -> tuple[list[int], list[float]]:
    """(steps, values) of one metric in a run's metrics.csv, in step order, rows without it skipped."""
    rows = read_metrics(run_dir)
    if rows and metric not in rows[0]:
        raise UserError(f"{Path(run_dir) / 'metrics.csv'} has no column {metric!r}; it has {', '.join(rows[0])}")
    return _points(rows, metric)


def _points(rows: Sequence[dict[str, str]], metric: str, kind: str | None = None) -> tuple[list[int], list[float]]:
    """(steps, finite values) of `metric` in `rows` (of `kind` only, when given); where several
    rows of one step have it (a train and an eval row log the same learning rate), the last counts."""
    points = {int(r["step"]): float(r[metric]) for r in rows if r.get(metric) and kind in (None, r.get("kind"))}
    points = {s: v for s, v in points.items() if math.isfinite(v)}
    return list(points), list(points.values())


@dataclass(frozen=True)
class CurvesPlot:
    """What `draw_run` drew: panel title -> line label (a metrics.csv column) -> (steps, values),
    read back from the figure's lines. `figure` is the matplotlib Figure."""

    figure: object
    panels: dict[str, dict[str, tuple[list[float], list[float]]]]


def draw_run(run_dir: str | Path) -> CurvesPlot:
    """Every curve a run logged, one panel each for the loss (train and validation), the task's
    validation metric (BLEU, accuracy, perplexity: whichever the run has), the learning rate and the
    throughput. Panels without data are left out. Raises `UserError` when metrics.csv is missing or
    has no data yet."""
    rows = read_metrics(run_dir)
    panels = []
    for title, columns in RUN_PANELS:
        lines = [(col, _points(rows, col, kind)) for col, kind in columns]
        lines = [(col, pts) for col, pts in lines if pts[0]]
        if lines:
            panels.append((title, lines))
    if not panels:
        raise UserError(f"{Path(run_dir) / 'metrics.csv'} has no logged values yet; train the run first")
    n_cols = 2 if len(panels) == 4 else min(3, len(panels))  # four panels: 2 x 2 rather than 3 + 1
    n_rows = math.ceil(len(panels) / n_cols)
    fig = new_figure(4.2 * n_cols, 3.2 * n_rows)
    axes = fig.subplots(n_rows, n_cols, squeeze=False).ravel()
    for ax in axes[len(panels) :]:
        ax.set_axis_off()
    drawn: dict[str, dict[str, tuple[list[float], list[float]]]] = {}
    for ax, (title, lines) in zip(axes, panels, strict=False):
        for col, (steps, values) in lines:
            ax.plot(steps, values, marker="o" if len(steps) < 30 else None, markersize=3, label=LABELS.get(col, col))
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        if title == "validation perplexity":
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
        if len(lines) > 1:
            ax.legend(fontsize=8)
        drawn[title] = {
            col: (list(map(float, line.get_xdata())), list(map(float, line.get_ydata())))
            for (col, _), line in zip(lines, ax.get_lines(), strict=True)
        }
    fig.suptitle(f"{Path(run_dir).name}: training curves")
    return CurvesPlot(fig, drawn)


def plot_run(run_dir: str | Path, path: str | Path) -> CurvesPlot:
    """`draw_run` saved as a PNG at `path`."""
    path = check_png_path(path)
    plot = draw_run(run_dir)
    save_png(plot.figure, path)
    return plot


def plot_curves(
    runs: Sequence[str | Path],
    metrics: Sequence[str],
    path: str | Path,
    *,
    labels: Sequence[str] | None = None,
    log_y: Sequence[str] = ("val_ppl",),
    title: str = "",
) -> Path:
    """Plot `metrics` (columns of metrics.csv, e.g. "val_accuracy") against the step for every
    run in `runs`, one panel per metric, and save the PNG at `path`."""
    path = check_png_path(path)
    if not runs or not metrics:
        raise ValueError("give at least one run and one metric")
    names = list(labels) if labels is not None else [Path(r).name for r in runs]
    if len(names) != len(runs):
        raise ValueError(f"{len(names)} labels for {len(runs)} runs")
    fig = new_figure(4.2 * len(metrics), 3.2)
    axes = fig.subplots(1, len(metrics), squeeze=False)[0]
    for ax, metric in zip(axes, metrics, strict=True):
        for run, name in zip(runs, names, strict=True):
            steps, values = read_metric(run, metric)
            ax.plot(steps, values, marker="o", markersize=3, label=name)
        ax.set_xlabel("step")
        ax.set_ylabel(LABELS.get(metric, metric))
        if metric in log_y:
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
    if len(runs) > 1:
        axes[0].legend(fontsize=8)
    if title:
        fig.suptitle(title)
    save_png(fig, path)
    return path
