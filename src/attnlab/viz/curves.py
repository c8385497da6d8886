"""Training curves from a run's metrics.csv: one panel per metric, one line per run."""

import csv
import math
from collections.abc import Sequence
from pathlib import Path

from attnlab.errors import UserError
from attnlab.viz.figure import check_png_path, new_figure, save_png

LABELS = {
    "train_loss": "training loss",
    "val_loss": "validation loss",
    "val_bleu": "validation BLEU",
    "val_accuracy": "validation accuracy",
    "val_ppl": "validation perplexity",
}


def read_metric(run_dir: str | Path, metric: str) -> tuple[list[int], list[float]]:
    """(steps, values) of one metric in a run's metrics.csv, in step order, rows without it skipped."""
    path = Path(run_dir) / "metrics.csv"
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
    except FileNotFoundError:
        raise UserError(f"{path} does not exist; give a run folder written by `attnlab train`") from None
    if rows and metric not in rows[0]:
        raise UserError(f"{path} has no column {metric!r}; it has {', '.join(rows[0])}")
    points = [(int(r["step"]), float(r[metric])) for r in rows if r.get(metric)]
    points = [(s, v) for s, v in points if math.isfinite(v)]
    return [s for s, _ in points], [v for _, v in points]


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
