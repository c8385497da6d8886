"""Where a run's metrics go: metrics.csv always, TensorBoard event files when `log.tensorboard`.

A metrics.csv row of kind K ("train" each log interval, "eval" each evaluation) and column C is
the TensorBoard scalar `K/C` at the row's step: `train/train_loss` is the loss of the steps,
`eval/val_loss` the evaluation's estimate. A resumed run purges the events after its checkpoint's
step, as metrics.csv drops its rows, so the curves show each step once.
"""

from pathlib import Path
from typing import Any, Protocol

from attnlab.errors import UserError

TENSORBOARD_DIR = "tensorboard"
_NOT_PLOTTED = ("step", "kind", "elapsed_sec")


class MetricsSink(Protocol):
    def write(self, **row: Any) -> None: ...


def require_tensorboard() -> None:
    """Raise a one-line UserError when the tensorboard package is missing."""
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        raise UserError(
            "log.tensorboard = true needs the tensorboard package: pip install tensorboard "
            "(or set log.tensorboard=false)"
        ) from None


def tensorboard_tag(kind: str, column: str) -> str:
    """The TensorBoard tag of a metrics.csv value: ("eval", "val_loss") -> "eval/val_loss"."""
    return f"{kind}/{column}"


class TensorBoardLog:
    """TensorBoard event files in `run_dir/tensorboard`, one scalar per metric and step."""

    def __init__(self, run_dir: Path, resume_step: int | None) -> None:
        require_tensorboard()
        from torch.utils.tensorboard import SummaryWriter

        # purge_step drops events at or after it: the resumed run redoes those steps.
        purge = None if resume_step is None else resume_step + 1
        self.writer = SummaryWriter(log_dir=str(run_dir / TENSORBOARD_DIR), purge_step=purge)

    def write(self, **row: Any) -> None:
        step, kind = row["step"], row["kind"]
        for key, value in row.items():
            if key not in _NOT_PLOTTED and isinstance(value, int | float):
                self.writer.add_scalar(tensorboard_tag(kind, key), value, global_step=step)
        self.writer.flush()  # rows come once per log interval: a reader sees them at once

    def close(self) -> None:
        self.writer.close()


class MetricsSinks:
    """Several metric logs written as one; none at all on the ranks that do not write."""

    def __init__(self, *sinks: MetricsSink) -> None:
        self.sinks = sinks

    def write(self, **row: Any) -> None:
        for sink in self.sinks:
            sink.write(**row)

    def close(self) -> None:
        for sink in self.sinks:
            if hasattr(sink, "close"):
                sink.close()
