"""The normalisation around each residual sublayer, chosen by name.

- layernorm (Ba et al. 2016): centre and scale each position's features, then a gain and a bias.
- rmsnorm (Zhang & Sennrich 2019): scale by the root mean square alone, a gain, no centring.
- rezero (Bachlechner et al. 2020): no norm; the sublayer's output is multiplied by a learned
  scalar α initialised at 0, so every block starts as the identity.
- rezero+layernorm, rezero+rmsnorm: both, as in Narang et al. 2021's table.

Shape legend: C model dim; norms act on the last dimension of `(..., C)`.
"""

import torch
from torch import nn

from attnlab.nn.positions import check_choice

NORMALIZATIONS = ("layernorm", "rmsnorm", "rezero", "rezero+layernorm", "rezero+rmsnorm", "offset-rmsnorm")


class RMSNorm(nn.Module):
    """x / sqrt(mean(x²) + eps) · g over the last dimension, computed in fp32 and cast back
    (Llama's order of operations: the gain multiplies the already cast value)."""

    def __init__(self, d_model: int, *, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class OffsetRMSNorm(nn.Module):
    """x / sqrt(mean(x²) + eps) · (1 + g), all in fp32 and cast back at the end: Gemma's RMSNorm,
    whose gain is stored as its offset from 1 (zero-initialised, so weight decay pulls it to 1)."""

    def __init__(self, d_model: int, *, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x32 * (1.0 + self.weight.float())).to(x.dtype)


class ReZero(nn.Module):
    """α · x with one learned scalar α, initialised at 0 (the residual branch starts switched off)."""

    def __init__(self) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.alpha * x


def check_normalization(name: str, field: str = "normalization") -> None:
    check_choice(field, name, NORMALIZATIONS)


def uses_rezero(name: str) -> bool:
    return name.startswith("rezero")


def build_norm(name: str, d_model: int, *, eps: float = 1e-5, bias: bool = True) -> nn.Module:
    """The norm module of a scheme: LayerNorm, RMSNorm, or the identity where the scheme has none."""
    check_normalization(name)
    kind = name.removeprefix("rezero").removeprefix("+")
    if kind == "layernorm":
        return nn.LayerNorm(d_model, eps=eps, bias=bias)
    if kind == "rmsnorm":
        return RMSNorm(d_model, eps=eps)
    if kind == "offset-rmsnorm":
        return OffsetRMSNorm(d_model, eps=eps)
    return nn.Identity()


def build_gate(name: str) -> nn.Module:
    """The residual branch's scale: ReZero's α, or the identity."""
    return ReZero() if uses_rezero(name) else nn.Identity()
