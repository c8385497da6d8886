"""Residual Transformer blocks: sublayer, dropout, residual connection, norm.

Two orders are in use:
- post-norm (the paper, §3.1; BERT): x = Norm(x + Sublayer(x))
- pre-norm (GPT-2, most modern LMs): x = x + Sublayer(Norm(x)); trains deeper stacks
  without warm-up tricks, and needs a final norm after the last block.

`parts` (`attnlab.nn.parts.BlockParts`) picks the norm (LayerNorm by default; RMSNorm; ReZero's
gate α, which scales each sublayer's output, x = x + α Sublayer(x)), the key/value heads of the
self-attention, and the feed-forward layer (dense, gated, or a mixture of experts).

Shape legend: B batch, T time, C model dim, H heads.
"""

import torch
from torch import nn

from attnlab.nn.attention import KVCache, MultiHeadAttention
from attnlab.nn.parts import BlockParts
from attnlab.nn.variants import AttentionSpec

NORM_ORDERS = ("pre", "post")
BLOCK_ORDERS = (*NORM_ORDERS, "sandwich")
"""A decoder-only block's orders: also "sandwich", a norm before and after each sublayer (Gemma 2
and 3's four norms a block: x = x + Norm'(Sublayer(Norm(x))))."""


class TransformerBlock(nn.Module):
    """Self-attention then feed-forward, each wrapped in a residual connection and a LayerNorm.

    This is the encoder layer of the paper (Figure 1, left). Under a causal mask it is also the
    decoder layer of a decoder-only model (GPT), which has no cross-attention. `spec` picks the
    self-attention's position scheme and pattern (`attnlab.nn.variants`).
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
        spec: AttentionSpec | None = None,
        parts: BlockParts | None = None,
    ) -> None:
        super().__init__()
        if norm not in BLOCK_ORDERS:
            raise ValueError(f"unknown norm order {norm!r}; choose one of {BLOCK_ORDERS}")
        parts = parts or BlockParts()
        self.order = norm
        self.pre_norm = norm == "pre"
        self.norm1 = parts.build_norm(d_model, eps=eps, bias=bias)
        self.gate1 = parts.build_gate()
        self.attn = parts.build_attention(
            d_model, n_heads, d_ff, activation=activation, dropout=dropout, bias=bias, spec=spec
        )
        self.dropout = nn.Dropout(dropout)
        if parts.branched:  # the Weighted Transformer: the branches hold the feed-forward layers
            self.norm2 = self.gate2 = self.ffn = None
            return
        self.norm2 = parts.build_norm(d_model, eps=eps, bias=bias)
        self.gate2 = parts.build_gate()
        self.ffn = parts.build_ffn(d_model, d_ff, activation=activation, dropout=dropout, bias=bias)
        if norm == "sandwich":  # the norms after each sublayer, before the residual sum
            self.post_norm1 = parts.build_norm(d_model, eps=eps, bias=bias)
            self.post_norm2 = parts.build_norm(d_model, eps=eps, bias=bias)

    def forward(
        self,
        x: torch.Tensor,
        *,
        mask: torch.Tensor | None = None,
        causal: bool = False,
        cache: KVCache | None = None,
        positions: int | torch.Tensor | None = None,
        need_weights: bool = False,
        keys: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x `(B, T, C)` -> `(B, T, C)`, and the attention weights `(B, H, T, Tk)` when asked for.
        `cache` and `positions` as in `MultiHeadAttention.forward`. keys: `(B, Tk, C)`, the sequence
        the keys and values are read from instead of x (normalised alike; x stays the residual):
        the Funnel Transformer's pooled queries reading the unpooled sequence (`attnlab.nn.funnel`)."""
        kw = dict(mask=mask, causal=causal, cache=cache, positions=positions, need_weights=need_weights)
        apart = () if keys is None else (keys,)  # passed only when given: a convolution takes x alone
        if self.order == "sandwich":
            a, weights = self.attn(self.norm1(x), *(self.norm1(k) for k in apart), **kw)
            x = x + self.gate1(self.dropout(self.post_norm1(a)))
            x = x + self.gate2(self.post_norm2(self.ffn(self.norm2(x))))
        elif self.pre_norm:
            a, weights = self.attn(self.norm1(x), *(self.norm1(k) for k in apart), **kw)
            x = x + self.gate1(self.dropout(a))
            if self.ffn is not None:
                x = x + self.gate2(self.ffn(self.norm2(x)))
        else:
            a, weights = self.attn(x, *apart, **kw)
            x = self.norm1(x + self.gate1(self.dropout(a)))
            if self.ffn is not None:
                x = self.norm2(x + self.gate2(self.ffn(x)))
        return x, weights


class DecoderBlock(nn.Module):
    """Masked self-attention, encoder–decoder attention, feed-forward (the paper's Figure 1, right).

    Each of the three sublayers sits in a residual connection with a LayerNorm, in the same pre- or
    post-norm order as `TransformerBlock`. The queries of the second sublayer come from the decoder,
    its keys and values from the encoder output ("memory"), §3.2.3.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_ff: int,
        *,
        dropout: float = 0.0,
        activation: str = "relu",
        bias: bool = True,
        norm: str = "post",
        eps: float = 1e-5,
        spec: AttentionSpec | None = None,
        parts: BlockParts | None = None,
    ) -> None:
        super().__init__()
        if norm not in BLOCK_ORDERS:
            raise ValueError(f"unknown norm order {norm!r}; choose one of {BLOCK_ORDERS}")
        parts = parts or BlockParts()
        self.order = norm
        self.pre_norm = norm == "pre"
        self.norm1 = parts.build_norm(d_model, eps=eps, bias=bias)
        self.gate1 = parts.build_gate()
        # `spec` (positions inside attention, a pattern of keys) is the self-attention's alone: the
        # cross-attention reads every source position, whose order the encoder has already seen.
        kv = parts.n_kv_heads
        self.self_attn = MultiHeadAttention(d_model, n_heads, dropout=dropout, bias=bias, spec=spec, n_kv_heads=kv)
        self.norm2 = parts.build_norm(d_model, eps=eps, bias=bias)
        self.gate2 = parts.build_gate()
        self.cross_attn = MultiHeadAttention(d_model, n_heads, dropout=dropout, bias=bias, n_kv_heads=kv)
        self.norm3 = parts.build_norm(d_model, eps=eps, bias=bias)
        self.gate3 = parts.build_gate()
        self.ffn = parts.build_ffn(d_model, d_ff, activation=activation, dropout=dropout, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(
        self,
        x: torch.Tensor,
        memory_kv: tuple[torch.Tensor, torch.Tensor],
        *,
        memory_mask: torch.Tensor | None = None,
        cache: KVCache | None = None,
        positions: int | torch.Tensor | None = None,
        need_weights: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x `(B, T, C)`; memory_kv: the encoder output projected by `cross_attn.project_memory`;
        memory_mask: bool `(B, 1, 1, S)`, True on real source tokens; `cache` and `positions` as in
        `MultiHeadAttention.forward`. Returns x `(B, T, C)` and, when asked for, the cross-attention
        weights `(B, H, T, S)`."""
        mine = dict(causal=True, cache=cache, positions=positions)  # the self-attention's

        def cross(h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
            return self.cross_attn(h, memory_kv=memory_kv, mask=memory_mask, need_weights=need_weights)

        if self.pre_norm:
            x = x + self.gate1(self.dropout(self.self_attn(self.norm1(x), **mine)[0]))
            a, weights = cross(self.norm2(x))
            x = x + self.gate2(self.dropout(a))
            x = x + self.gate3(self.ffn(self.norm3(x)))
        else:
            x = self.norm1(x + self.gate1(self.dropout(self.self_attn(x, **mine)[0])))
            a, weights = cross(x)
            x = self.norm2(x + self.gate2(self.dropout(a)))
            x = self.norm3(x + self.gate3(self.ffn(x)))
        return x, weights
