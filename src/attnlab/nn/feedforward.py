"""The position-wise feed-forward network and its gated variants.

- dense (Vaswani et al. §3.3): FFN(x) = act(x W1 + b1) W2 + b2.
- gated linear units (Dauphin et al. 2017; Shazeer 2020): FFN(x) = (act(x W) ⊙ x V) W2, with
  act = sigmoid (GLU), GELU (GEGLU), ReLU (ReGLU), Swish (SwiGLU) or the identity (LiGLU, the
  bilinear layer). W and V are stored stacked in one `fc1` of `2F` rows, `[W; V]`.

A gated layer has three matrices instead of two; `gated_width` gives the hidden width that keeps
the dense layer's parameter count (2/3 of it), as Shazeer does.
"""

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.nn.positions import check_choice


def gelu(x: torch.Tensor) -> torch.Tensor:
    """GELU, x Φ(x) (Hendrycks & Gimpel 2016)."""
    return F.gelu(x)


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """GELU with the tanh approximation, as in the original BERT and GPT-2 code."""
    return F.gelu(x, approximate="tanh")


ACTIVATIONS = {
    "relu": F.relu,
    "gelu": gelu,
    "gelu_tanh": gelu_tanh,
    "swish": F.silu,  # x σ(x) (Ramachandran et al. 2017), β = 1
    "elu": F.elu,
    "selu": F.selu,
    "sigmoid": torch.sigmoid,
    "softplus": F.softplus,
}
"""Non-linearities of the dense feed-forward layer, by name."""

GATED_UNITS = {
    "glu": torch.sigmoid,
    "geglu": gelu,
    "geglu_tanh": gelu_tanh,  # Gemma's: GELU's tanh approximation on the gate
    "reglu": F.relu,
    "swiglu": F.silu,
    "liglu": lambda x: x,
}
"""Gated linear units (Shazeer 2020), by name: the function applied to the gate x W."""

FEEDFORWARDS = (*ACTIVATIONS, *GATED_UNITS)
"""Every name a config's `activation` takes."""


def check_activation(name: str) -> None:
    check_choice("activation", name, FEEDFORWARDS)


def is_gated(activation: str) -> bool:
    return activation in GATED_UNITS


def gated_width(d_ff: int) -> int:
    """The hidden width of a gated layer with as many parameters as a dense one of width d_ff."""
    return max(1, round(2 * d_ff / 3))


def pointwise(activation: str):
    """The element-wise function an activation name stands for (a gated unit's gate function),
    for layers outside the feed-forward block such as BERT's MLM transform."""
    return GATED_UNITS[activation] if activation in GATED_UNITS else ACTIVATIONS[activation]


def activate(activation: str, h: torch.Tensor) -> torch.Tensor:
    """The hidden activation from fc1's output h `(..., F)` dense, or `(..., 2F)` gated `[x W, x V]`."""
    if activation in GATED_UNITS:
        gate, up = h.chunk(2, dim=-1)
        return GATED_UNITS[activation](gate) * up
    return ACTIVATIONS[activation](h)


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
        self.fc1 = nn.Linear(d_model, d_ff, bias=bias)
        self.act = ACTIVATIONS[activation]
        self.fc2 = nn.Linear(d_ff, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.fc2(self.act(self.fc1(x))))


class GatedFeedForward(nn.Module):
    """(act(x W) ⊙ x V) W2: x `(B, T, C)` -> `(B, T, C)` through a hidden width `d_ff`.
    `fc1` holds `[W; V]`, `(2 d_ff, C)`; `fc2` is W2."""

    def __init__(
        self, d_model: int, d_ff: int, *, activation: str = "swiglu", dropout: float = 0.0, bias: bool = True
    ) -> None:
        super().__init__()
        if activation not in GATED_UNITS:
            raise ValueError(f"unknown gated unit {activation!r}; choose one of {sorted(GATED_UNITS)}")
        self.activation = activation
        self.fc1 = nn.Linear(d_model, 2 * d_ff, bias=bias)
        self.fc2 = nn.Linear(d_ff, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.fc2(activate(self.activation, self.fc1(x))))


def build_feedforward(
    d_model: int, d_ff: int, *, activation: str, dropout: float = 0.0, bias: bool = True
) -> FeedForward | GatedFeedForward:
    """The dense or gated feed-forward layer that `activation` names; d_ff is its hidden width as is."""
    check_activation(activation)
    kind = GatedFeedForward if is_gated(activation) else FeedForward
    return kind(d_model, d_ff, activation=activation, dropout=dropout, bias=bias)
