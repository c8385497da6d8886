"""The position-wise feed-forward network: FFN(x) = act(x W1 + b1) W2 + b2 (Vaswani et al. §3.3)."""

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.nn import kernels
from attnlab.nn.projection import Linear


def gelu(x: torch.Tensor) -> torch.Tensor:
    """GELU, x Φ(x) (Hendrycks & Gimpel 2016); attnlab's kernel inside `kernels.enabled()`."""
    return kernels.gelu(x)


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """GELU with the tanh approximation, as in the original BERT and GPT-2 code."""
    return kernels.gelu(x, approximate="tanh")


ACTIVATIONS = {
    "relu": F.relu,
    "gelu": gelu,
    "gelu_tanh": gelu_tanh,
}


class FeedForward(nn.Module):
    """Two linear maps with a non-linearity between them, applied to each position alone.

    x `(B, T, C)` -> `(B, T, C)`, through a hidden width `d_ff` (4C in the paper and GPT-2).
    """

    def __init__(
        self, d_model: int, d_ff: int, *, activation: str = "gelu", dropout: float = 0.0, bias: bool = True
    ) -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation {activation!r}; choose one of {sorted(ACTIVATIONS)}")
        self.activation = activation
        self.fc1 = Linear(d_model, d_ff, bias=bias)
        self.act = ACTIVATIONS[activation]
        self.fc2 = Linear(d_ff, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.fc2(self.act(self.fc1(x))))
