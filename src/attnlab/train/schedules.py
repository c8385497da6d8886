"""Learning-rate schedules as pure functions of the step."""

import math


def warmup_cosine(step: int, *, max_lr: float, min_lr: float, warmup: int, decay_steps: int) -> float:
    """Linear warm-up to max_lr over `warmup` steps, cosine decay to min_lr at `decay_steps`, then flat.

    The schedule of GPT-3 (Brown et al. 2020, §B) as nanoGPT writes it; step counts from 0.
    Example: warmup 10, decay 100 -> step 0: max_lr/11, step 10: max_lr, step 100+: min_lr.
    """
    if step < warmup:
        return max_lr * (step + 1) / (warmup + 1)
    if step >= decay_steps:
        return min_lr
    progress = (step - warmup) / max(1, decay_steps - warmup)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (max_lr - min_lr)


def inverse_sqrt(step: int, *, max_lr: float, warmup: int) -> float:
    """The paper's schedule (Vaswani et al. Eq. 3) scaled to peak at max_lr: linear warm-up over
    `warmup` steps, then decay ∝ 1/√step. With max_lr = d_model^-0.5 · warmup^-0.5 it is Eq. 3
    exactly: d^-0.5 · min(n^-0.5, n · warmup^-1.5), n = step + 1.
    """
    n = step + 1
    warmup = max(warmup, 1)
    return max_lr * min(n / warmup, math.sqrt(warmup / n))
