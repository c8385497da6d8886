"""Which evaluation's weights are the best, and when to stop early (train.patience)."""

from dataclasses import dataclass, field
from typing import Any

from attnlab.errors import ConfigError


@dataclass
class Selection:
    """The best value of the task's selection metric so far and the evaluations in a row without
    progress; both are part of a checkpoint (`state_dict`), so a resumed run judges on."""

    metric: tuple[str, str] | None
    """(name, "min" | "max"), the task's `selection`; None keeps no best checkpoint."""
    patience: int
    """Stop after this many evaluations in a row without progress (0: never)."""
    watch_loss: bool
    task: str
    ties_count: bool = False
    """Without watch_loss: a tie with the best is progress and a new best (train.ties_count)."""
    best: float | None = None
    stale: int = 0
    peaks: dict[str, float] = field(default_factory=dict)
    """With train.watch_loss: the best selection metric and val_loss seen so far."""

    def judge(self, results: dict[str, float]) -> bool:
        """Record an evaluation; True when its weights are the new best."""
        improved, progress = self._verdict(results)
        if improved:
            self.best = results[self.metric[0]]
        self.stale = 0 if progress else self.stale + 1
        return improved

    def patience_spent(self) -> bool:
        return self.patience > 0 and self.stale >= self.patience

    def best_record(self, step: int) -> dict[str, Any]:
        """What the checkpoint's manifest says of the best weights, saved at `step`."""
        return {"step": step, self.metric[0]: self.best}

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "stale": self.stale, "peaks": self.peaks}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best, self.stale, self.peaks = state.get("best"), state.get("stale", 0), state.get("peaks", {})

    def _verdict(self, results: dict[str, float]) -> tuple[bool, bool]:
        """Whether these weights are the new best, and whether the evaluation is progress (it
        restarts the patience). Alone, the selection metric decides both: strictly, or ties
        included with train.ties_count. With train.watch_loss, as GAT's reference code: progress
        when the metric or val_loss reaches its best so far (ties included), a new best when both do."""
        if self.metric is None:
            return False, False
        name, mode = self.metric
        if not self.watch_loss:
            best, value = self.best, results[name]
            if best is None or (self.ties_count and value == best):
                return True, True
            better = value < best if mode == "min" else value > best
            return better, better
        if "val_loss" not in results:
            raise ConfigError(f"train.watch_loss needs a val_loss, which a {self.task!r} run does not report")
        peaks = self.peaks
        reached = {
            name: name not in peaks or _at_least(results[name], peaks[name], mode),
            "val_loss": "val_loss" not in peaks or results["val_loss"] <= peaks["val_loss"],
        }
        peaks.update({k: results[k] for k, hit in reached.items() if hit})
        return all(reached.values()), any(reached.values())


def _at_least(value: float, peak: float, mode: str) -> bool:
    """Whether `value` is as good as `peak` or better (ties count)."""
    return value <= peak if mode == "min" else value >= peak
