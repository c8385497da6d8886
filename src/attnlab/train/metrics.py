"""metrics.csv: one row per log interval ("train") and per evaluation ("eval"), with TensorBoard
event files beside it when `log.tensorboard` asks for them (see `train.tensorboard`)."""

import csv
from pathlib import Path
from typing import Any

from attnlab.train.config import RunConfig
from attnlab.train.tensorboard import MetricsSinks, TensorBoardLog

METRICS_FIELDS = [
    "step",
    "kind",
    "train_loss",
    "val_loss",
    "val_bleu",
    "val_accuracy",
    "val_ppl",
    "lr",
    "tokens_per_sec",
    "elapsed_sec",
    "skipped_steps",
    "aux_loss",
    "dropped_tokens",
]


class MetricsLog:
    """metrics.csv, appended to; on resume the rows after the checkpoint's step are dropped (that
    work is being redone)."""

    def __init__(self, path: Path, resume_step: int | None) -> None:
        self.path = path
        if resume_step is not None and path.exists():
            with open(path, newline="") as f:
                rows = [r for r in csv.DictReader(f) if int(r["step"]) <= resume_step]
            self._rewrite(rows)
        elif resume_step is None:
            self._rewrite([])

    def _rewrite(self, rows: list[dict]) -> None:
        with open(self.path, "w", newline="") as f:
            writer = csv.DictWriter(f, METRICS_FIELDS)
            writer.writeheader()
            writer.writerows(rows)

    def write(self, **row: Any) -> None:
        with open(self.path, "a", newline="") as f:
            csv.DictWriter(f, METRICS_FIELDS).writerow({k: _fmt(v) for k, v in row.items()})


def metrics_sinks(config: RunConfig, run_dir: Path, resume_step: int | None) -> MetricsSinks:
    """metrics.csv, and TensorBoard event files when the config asks for them."""
    csv_log = MetricsLog(run_dir / "metrics.csv", resume_step)
    if config.log.tensorboard:
        return MetricsSinks(csv_log, TensorBoardLog(run_dir, resume_step))
    return MetricsSinks(csv_log)


def last_evaluation(path: Path) -> dict[str, float]:
    """The results of the last evaluation metrics.csv records (val_loss, val_bleu, ...), or {}."""
    if not path.exists():
        return {}
    with open(path, newline="") as f:
        evals = [r for r in csv.DictReader(f) if r["kind"] == "eval"]
    if not evals:
        return {}
    skip = {"step", "kind", "lr", "tokens_per_sec", "elapsed_sec", "skipped_steps"}
    return {k: float(v) for k, v in evals[-1].items() if k not in skip and v not in ("", None)}


def describe(results: dict[str, float]) -> str:
    """{"val_loss": 1.5} -> "val loss 1.5000": an evaluation as the log line says it."""
    return ", ".join(f"{k.replace('_', ' ')} {v:.4f}" for k, v in results.items())


def _fmt(v: Any) -> Any:
    return f"{v:.6g}" if isinstance(v, float) else v
