"""What applying attnlab's tuned code to a model did: `Applied`."""

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn


def reference_cross_entropy(
    logits: torch.Tensor, target: torch.Tensor, *, label_smoothing: float = 0.0, ignore_index: int = -100
) -> torch.Tensor:
    """The mean cross-entropy of logits `(N, V)` against target `(N,)`, in fp32 whatever the
    logits' dtype: PyTorch's, the function `attnlab.accel.kernels.cross_entropy` computes."""
    return F.cross_entropy(logits.float(), target, label_smoothing=label_smoothing, ignore_index=ignore_index)


@dataclass(frozen=True)
class Applied:
    """What `for_training` or `for_decoding` did to a model."""

    model: nn.Module
    """The same model, its covered modules running the tuned code."""
    covered: tuple[str, ...] = ()
    """The names (in `model.named_modules()`) of the modules that now run the tuned code."""
    uncovered: str | None = None
    """Why (some of) the model runs PyTorch's reference code, in words; None where nothing is left."""
    cross_entropy: Callable[..., torch.Tensor] = field(default=reference_cross_entropy)
    """The loss a task computes itself (the masked LM's): the kernel's where the kernels are on."""
