"""Positional encodings, chosen by name so that new variants plug in without touching the models.

Every encoding is a module mapping positions `(T,)` (long) to vectors `(T, C)` that are added to
the token embeddings. Self-attention alone is permutation-equivariant; these vectors are what
tells it where each token is.

References: Vaswani et al. 2017 §3.5 (sinusoidal); Radford et al. 2018/2019 (learned, GPT).
"""

import math

import torch
from torch import nn


def sinusoidal_positions(n_positions: int, d_model: int) -> torch.Tensor:
    """The table of §3.5: PE[pos, 2i] = sin(pos / 10000^(2i/d)), PE[pos, 2i+1] = cos(pos / 10000^(2i/d)).

    Returns float32 `(n_positions, d_model)`. Each pair of columns is a rotation at its own
    frequency, so PE[pos + k] is a linear function of PE[pos] and the dot product of two rows
    depends only on their offset.
    """
    position = torch.arange(n_positions, dtype=torch.float64).unsqueeze(1)  # (T, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # (ceil(C/2),)
    angle = position / torch.pow(10000.0, two_i / d_model)  # (T, ceil(C/2))
    table = torch.zeros(n_positions, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angle)
    table[:, 1::2] = torch.cos(angle[:, : d_model // 2])
    return table.float()


class SinusoidalPositions(nn.Module):
    """Fixed sinusoidal encodings (no parameters)."""

    def __init__(self, n_positions: int, d_model: int) -> None:
        super().__init__()
        self.register_buffer("table", sinusoidal_positions(n_positions, d_model), persistent=False)

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        return self.table[positions]


class LearnedPositions(nn.Module):
    """One trained vector per absolute position (GPT, BERT)."""

    def __init__(self, n_positions: int, d_model: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(n_positions, d_model)

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        return self.embedding(positions)


class NoPositions(nn.Module):
    """No positional information at all: the model sees a bag of tokens (for the lectures' "why?")."""

    def __init__(self, n_positions: int, d_model: int) -> None:
        super().__init__()
        self.d_model = d_model
        # A buffer, so that `.to(device, dtype)` moves it like the other encodings' tables: zeros in
        # the default dtype would promote a bf16 model's activations to fp32 and break its LayerNorms.
        self.register_buffer("zero", torch.zeros(d_model), persistent=False)

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        return self.zero.expand(*positions.shape, self.d_model)


POSITIONS: dict[str, type[nn.Module]] = {
    "learned": LearnedPositions,
    "sinusoidal": SinusoidalPositions,
    "none": NoPositions,
}


def build_positions(kind: str, n_positions: int, d_model: int) -> nn.Module:
    """The positional encoding called `kind` (one of `POSITIONS`)."""
    if kind not in POSITIONS:
        raise ValueError(f"unknown positional encoding {kind!r}; choose one of {sorted(POSITIONS)}")
    return POSITIONS[kind](n_positions, d_model)


def embedding_scale(d_model: int) -> float:
    """√d_model: the factor the paper multiplies token embeddings by before adding positions (§3.4)."""
    return math.sqrt(d_model)
