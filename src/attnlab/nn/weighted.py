"""The Weighted Transformer's branched attention (Ahmed et al. 2017, §3, Eq. 3–4).

Multi-head attention concatenates its heads and projects them with one W_O; branched attention
keeps each head on a branch of its own: the head's output gets its own projection W_O^i `(D, C)`,
is scaled by κ_i, goes through a feed-forward layer of its own, and the branches are summed with
weights α_i:

    head̄_i = κ_i · head_i W_O^i,    BranchedAttention(x) = Σ_i α_i FFN_i(head̄_i),

with κ and α each summing to 1 (here softmax-normalised learned logits; the paper projects them
back onto the simplex after each step). The branches' feed-forward layers replace the block's
own, so a block is one residual sublayer, x + BranchedAttention(Norm(x)). Each branch's hidden
width is d_ff / H, so that the H branches hold the parameters of one dense layer of width d_ff,
and the H projections W_O^i those of one W_O.

Shape legend: B batch, T time, H heads (= branches), D head dim, C model dim, F a branch's hidden width.
"""

import torch
from torch import nn

from attnlab.nn.attention import MultiHeadAttention
from attnlab.nn.feedforward import ACTIVATIONS
from attnlab.nn.init import EMBEDDING_STD
from attnlab.nn.variants import AttentionSpec


def _weight(*shape: int) -> nn.Parameter:
    return nn.Parameter(torch.randn(*shape) * EMBEDDING_STD)


class Branches(nn.Module):
    """Σ_i α_i FFN_i(κ_i · head_i W_O^i) for the heads `(B, T, H, D)` -> `(B, T, C)`."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, *, activation: str, dropout: float) -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"branched attention's feed-forward layers take a dense activation, got {activation!r}")
        d, f = d_model // n_heads, max(1, d_ff // n_heads)
        self.activation = ACTIVATIONS[activation]
        self.w_o, self.b_o = _weight(n_heads, d, d_model), nn.Parameter(torch.zeros(n_heads, d_model))
        self.w1, self.b1 = _weight(n_heads, d_model, f), nn.Parameter(torch.zeros(n_heads, f))
        self.w2, self.b2 = _weight(n_heads, f, d_model), nn.Parameter(torch.zeros(n_heads, d_model))
        # Equal logits: every branch starts with κ_i = α_i = 1/H.
        self.kappa_logits = nn.Parameter(torch.zeros(n_heads))
        self.alpha_logits = nn.Parameter(torch.zeros(n_heads))
        self.dropout = nn.Dropout(dropout)

    @property
    def kappa(self) -> torch.Tensor:
        return torch.softmax(self.kappa_logits, dim=0)

    @property
    def alpha(self) -> torch.Tensor:
        return torch.softmax(self.alpha_logits, dim=0)

    def forward(self, heads: torch.Tensor) -> torch.Tensor:
        dtype = heads.dtype
        z = torch.einsum("bthd,hdc->bthc", heads, self.w_o.to(dtype)) + self.b_o.to(dtype)  # (B, T, H, C)
        z = z * self.kappa.to(dtype)[:, None]
        h = self.activation(torch.einsum("bthc,hcf->bthf", z, self.w1.to(dtype)) + self.b1.to(dtype))  # (B, T, H, F)
        h = self.dropout(h)
        out = torch.einsum("bthf,hfc->bthc", h, self.w2.to(dtype)) + self.b2.to(dtype)  # (B, T, H, C)
        return self.dropout(torch.einsum("bthc,h->btc", out, self.alpha.to(dtype)))


class BranchedAttention(MultiHeadAttention):
    """Multi-head attention whose heads end in `Branches` instead of concatenation and W_O: the
    heads are computed as `MultiHeadAttention` computes them (every path, cache and position
    scheme alike); `out_proj` is the branches, and the heads reach it unmerged."""

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_ff: int,
        *,
        activation: str,
        dropout: float = 0.0,
        bias: bool = True,
        spec: AttentionSpec | None = None,
        n_kv_heads: int | None = None,
    ) -> None:
        super().__init__(d_model, n_heads, dropout=dropout, bias=bias, spec=spec, n_kv_heads=n_kv_heads)
        self.out_proj = Branches(d_model, n_heads, d_ff, activation=activation, dropout=dropout)

    def _merge_heads(self, y: torch.Tensor) -> torch.Tensor:
        return y.transpose(1, 2)  # (B, H, T, D) -> (B, T, H, D): one branch per head
