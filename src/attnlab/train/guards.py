"""Guards of the training loop against numerical blow-ups.

A step whose loss or gradient norm is not finite (NaN or inf) is skipped: its gradients are thrown
away, the weights and the optimizer's moments stay as they were, and the step is counted in
metrics.csv (`skipped_steps`). Once `max_bad_steps` steps in a row are bad, the run stops with
`TrainingDiverged`, writing nothing, so the run folder keeps its last good checkpoint. A loss far
above its running average is only warned about: whether to act on it is the user's call
(Chowdhery et al. 2022, PaLM §5.1, met such spikes by restarting from an earlier checkpoint and
skipping the batches around them).
"""

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from attnlab.errors import UserError
from attnlab.train.optim import ClippingAdamW, clip_grad_norm


class TrainingDiverged(UserError):
    """Too many consecutive steps with a non-finite loss or gradient norm."""


@dataclass
class StepGuard:
    """Decides, once per optimizer step, whether the step may update the weights.

    `admit(step, loss, grad_norm)` is False for a step to skip. `skipped` (in all) and `streak` (in a
    row) are part of the training state, so a resumed run counts on: see `state_dict`.
    """

    max_bad_steps: int
    spike_factor: float
    """Warn when the loss exceeds this multiple of its running average (0: never)."""
    log: Callable[[str], None]
    skipped: int = 0
    streak: int = 0
    average: float | None = None
    """Exponential moving average of the admitted steps' losses."""
    seen: int = 0

    SPIKE_SPAN = 20
    """The average's span in steps (weight 2 / (span + 1) for the newest loss); no warnings before
    that many steps were seen, while the average is still settling."""

    def admit(self, step: int, loss: float, grad_norm: float) -> bool:
        if not (math.isfinite(loss) and math.isfinite(grad_norm)):
            self.skipped += 1
            self.streak += 1
            what = f"loss {loss}" if not math.isfinite(loss) else f"gradient norm {grad_norm}"
            self.log(f"step {step}: non-finite {what}; step skipped ({self.streak} in a row, {self.skipped} in all)")
            if self.streak >= self.max_bad_steps:
                raise TrainingDiverged(
                    f"training diverged: {self.streak} steps in a row (steps {step - self.streak + 1}-{step}) had a "
                    "non-finite loss or gradient norm (train.max_bad_steps); stopped without saving, so the run "
                    "folder keeps its last good checkpoint: lower train.learning_rate or set train.grad_clip, "
                    "then continue with --resume"
                )
            return False
        self.streak = 0
        if self.spike_factor and self.seen >= self.SPIKE_SPAN and loss > self.spike_factor * self.average:
            self.log(
                f"step {step}: loss spike: {loss:.4f} is {loss / self.average:.1f}x its running average "
                f"{self.average:.4f}"
            )
        alpha = 2 / (self.SPIKE_SPAN + 1)
        self.average = loss if self.average is None else (1 - alpha) * self.average + alpha * loss
        self.seen += 1
        return True

    def state_dict(self) -> dict[str, int]:
        return {"skipped_steps": self.skipped, "bad_streak": self.streak}

    def load_state_dict(self, state: dict) -> None:
        """Counts saved by `state_dict` (absent from checkpoints written before the guard: zero)."""
        self.skipped, self.streak = state.get("skipped_steps", 0), state.get("bad_streak", 0)


def grad_norm(model: torch.nn.Module, clip: float, optimizer: torch.optim.Optimizer | None = None) -> torch.Tensor:
    """The global L2 norm of the gradients (a 0-dim tensor, no host sync), clipping them to `clip`
    first when `clip` > 0 (a `ClippingAdamW` optimizer clips them in its next step)."""
    if isinstance(optimizer, ClippingAdamW):
        return optimizer.clip_grad_norm_(clip)
    return clip_grad_norm([p for p in model.parameters() if p.grad is not None], clip)
