"""Residual Transformer blocks: sublayer, dropout, residual connection, LayerNorm.

Two orders are in use:
- post-norm (the paper, §3.1; BERT): x = LayerNorm(x + Sublayer(x))
- pre-norm (GPT-2, most modern LMs): x = x + Sublayer(LayerNorm(x)); trains deeper stacks
  without warm-up tricks, and needs a final LayerNorm after the last block.

Shape legend: B batch, T time, C model dim, H heads.
"""

import torch
from torch import nn

from attnlab.nn.attention import KVCache, MultiHeadAttention
from attnlab.nn.feedforward import FeedForward

NORM_ORDERS = ("pre", "post")


class TransformerBlock(nn.Module):
    """Self-attention then feed-forward, each wrapped in a residual connection and a LayerNorm.

    This is the encoder layer of the paper (Figure 1, left). Under a causal mask it is also the
    decoder layer of a decoder-only model (GPT), which has no cross-attention.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_ff: int,
        *,
        dropout: float = 0.0,
        activation: str = "gelu",
        bias: bool = True,
        norm: str = "pre",
        eps: float = 1e-5,
    ) -> None:
        super().__init__()
        if norm not in NORM_ORDERS:
            raise ValueError(f"unknown norm order {norm!r}; choose one of {NORM_ORDERS}")
        self.pre_norm = norm == "pre"
        self.norm1 = nn.LayerNorm(d_model, eps=eps, bias=bias)
        self.attn = MultiHeadAttention(d_model, n_heads, dropout=dropout, bias=bias)
        self.norm2 = nn.LayerNorm(d_model, eps=eps, bias=bias)
        self.ffn = FeedForward(d_model, d_ff, activation=activation, dropout=dropout, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(
        self,
        x: torch.Tensor,
        *,
        mask: torch.Tensor | None = None,
        causal: bool = False,
        cache: KVCache | None = None,
        need_weights: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x `(B, T, C)` -> `(B, T, C)`, and the attention weights `(B, H, T, Tk)` when asked for."""
        if self.pre_norm:
            a, weights = self.attn(self.norm1(x), mask=mask, causal=causal, cache=cache, need_weights=need_weights)
            x = x + self.dropout(a)
            x = x + self.ffn(self.norm2(x))
        else:
            a, weights = self.attn(x, mask=mask, causal=causal, cache=cache, need_weights=need_weights)
            x = self.norm1(x + self.dropout(a))
            x = self.norm2(x + self.ffn(x))
        return x, weights
