"""The Evolved Transformer (So et al. 2019): the encoder and decoder cells found by evolution.

Each cell is a stack of pre-norm residual sub-blocks (d = model width, H = heads; `norm = "post"`
puts each sub-block's outer norm after its residual sum instead). Encoder cell (Figure 3, left):

1. x + GLU(LN(x)): a d → 2d linear, the first half gated by the sigmoid of the second;
2. x + h, h = LN(x); left = ReLU(Linear d → 4d)(h), right = ReLU(Conv 3×1, d → d/2)(h) zero-padded
   to 4d; h = LN(left + right); h = SepConv 9×1 (4d → d/2)(h) zero-padded to d;
3. x + SelfAttention_H(LN(x));
4. x + FFN(LN(x)): ReLU, hidden 4d.

Decoder cell (Figure 3, right), its convolutions causal (k − 1 zeros on the left):

1. x + SelfAttention_2H(LN(x)) + CrossAttention_H(LN(x), memory);
2. x + h, h = LN(x); left = ReLU(SepConv 11×1, d → 2d)(h), right = SepConv 7×1 (d → d/2)(h)
   zero-padded to 2d; h = LN(left + right); h = SepConv 7×1 (2d → d)(h);
3. x + SelfAttention_H(LN(x));
4. x + CrossAttention_H(LN(x), memory);
5. x + FFN(LN(x)): Swish, hidden 4d, a LayerNorm over the hidden units before the second linear
   map (as the authors' tensor2tensor code has it; the paper's figure leaves that norm out).

A causal language model (the GPT) takes the decoder cell without its two cross-attentions. A
separable convolution (SepConv) is a depthwise convolution (each channel its own k taps, no bias)
followed by a pointwise one (a linear map). In the encoder the convolutions are centred (SAME
padding) and padded positions are zeroed before each convolution, so padding adds nothing.

Decoding: a causal convolution reads its last k − 1 inputs only; `EvolvedCache` keeps those of
the cell's three convolutions (`ConvCache`) beside the two self-attentions' KV caches, and each
step computes the same sums as the whole forward.

Shape legend: B batch, T time, C model dim (d), H heads, K kernel taps.

References:
- So, Liang, Le 2019, "The Evolved Transformer", ICML, Figure 3 and Appendix.
- tensor2tensor, `models/evolved_transformer.py` (the authors' implementation).
- Narang et al. 2021, "Do Transformer Modifications Transfer Across Implementations and
  Applications?", Table 1 (the Evolved Transformer row).
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.nn.attention import KVCache, MultiHeadAttention
from attnlab.nn.conv_attention import ConvCache
from attnlab.nn.norms import build_norm
from attnlab.nn.variants import AttentionSpec

BLOCKS = ("transformer", "evolved")
"""The `model.block` names: the Transformer's blocks (the family's own), or the Evolved
Transformer's cells."""

EVOLVED_NORMALIZATIONS = ("layernorm", "rmsnorm")
"""Norms the cells take: each cell has norms inside its sub-blocks, where ReZero's gate or Fixup's
scalars have no place."""


def check_evolved(d_model: int, n_heads: int, *, normalization: str, attention: str, others: list[str]) -> None:
    """ValueError naming what an evolved block cannot take: a width that 2H heads or d/2 do not
    divide, a norm other than `EVOLVED_NORMALIZATIONS`, a pattern other than full attention, or
    another part that replaces a sublayer (`others`: their field names, already set)."""
    if d_model % (2 * n_heads) != 0:
        raise ValueError(
            f"block 'evolved' runs a self-attention of 2 × n_heads = {2 * n_heads} heads, which must divide "
            f"d_model ({d_model})"
        )
    if normalization not in EVOLVED_NORMALIZATIONS:
        raise ValueError(
            f"block 'evolved' takes normalization 'layernorm' or 'rmsnorm' (norms sit inside its cells), "
            f"got {normalization!r}"
        )
    if attention != "full":
        raise ValueError(f"block 'evolved' runs full attention (any position scheme); got attention {attention!r}")
    if others:
        raise ValueError(f"block 'evolved' has its own sublayers; leave {', '.join(others)} unset")


def pad_channels(x: torch.Tensor, width: int) -> torch.Tensor:
    """x `(..., c)` with zeros appended to `width` channels: the cells' narrow branches joined to wide ones."""
    return F.pad(x, (0, width - x.size(-1)))


class TimeConv(nn.Module):
    """A convolution over time of x `(B, T, C_in)` -> `(B, T, C_out)`: a full one, d_in → d_out with
    K taps (`separable=False`), or a separable one (a depthwise convolution of K taps per channel,
    no bias, then a pointwise linear map d_in → d_out). Causal: output t reads inputs t − K + 1 … t;
    centred: ⌊K/2⌋ before and K − 1 − ⌊K/2⌋ after (TensorFlow's SAME padding). Zeros outside the sequence."""

    def __init__(self, d_in: int, d_out: int, kernel: int, *, causal: bool, separable: bool, bias: bool = True) -> None:
        super().__init__()
        self.kernel, self.causal, self.d_in = kernel, causal, d_in
        if separable:
            self.depthwise = nn.Conv1d(d_in, d_in, kernel, groups=d_in, bias=False)
            self.pointwise = nn.Linear(d_in, d_out, bias=bias)
        else:
            self.conv = nn.Conv1d(d_in, d_out, kernel, bias=bias)

    def extra_repr(self) -> str:
        return f"kernel={self.kernel}, causal={self.causal}"

    def forward(
        self, x: torch.Tensor, cache: ConvCache | None = None, positions: int | torch.Tensor | None = None
    ) -> torch.Tensor:
        """x `(B, T, C_in)`; `cache` (causal only): the last K − 1 inputs, the new ones appended at
        `positions` (the model's count, an int, or a tensor)."""
        k = self.kernel
        if cache is None:
            left = k - 1 if self.causal else k // 2
            padded = F.pad(x, (0, 0, left, k - 1 - left))  # (B, T + K − 1, C_in)
        else:
            if not self.causal:
                raise ValueError("a ConvCache serves causal convolutions (a decoder) only")
            if positions is None:
                raise ValueError("a ConvCache takes the new inputs' positions: the model's count (an int) or a tensor")
            padded = cache.update(positions, x).to(x.dtype)
        h = padded.transpose(1, 2)  # (B, C_in, T + K − 1)
        if hasattr(self, "conv"):
            return self.conv(h).transpose(1, 2)
        return self.pointwise(self.depthwise(h).transpose(1, 2))


class EvolvedFeedForward(nn.Module):
    """The cells' feed-forward layer: fc2(act(fc1 x)), hidden 4C; the decoder's (Swish) with a norm
    over the hidden units before fc2 (`hidden_norm`)."""

    def __init__(
        self, d_model: int, *, activation: Callable, hidden_norm: nn.Module | None, dropout: float, bias: bool
    ) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_model, 4 * d_model, bias=bias)
        self.act = activation
        self.hidden_norm = hidden_norm or nn.Identity()
        self.fc2 = nn.Linear(4 * d_model, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.hidden_norm(self.dropout(self.act(self.fc1(x)))))


class _Cell(nn.Module):
    """What both cells share: the norm order, the dropout, the residual sub-block."""

    def __init__(self, d_model: int, *, dropout: float, norm: str, normalization: str, eps: float, bias: bool) -> None:
        super().__init__()
        if norm not in ("pre", "post"):
            raise ValueError(f"unknown norm order {norm!r}; choose 'pre' or 'post'")
        self.d_model, self.pre_norm = d_model, norm == "pre"
        self.dropout = nn.Dropout(dropout)
        self._norm_args = dict(eps=eps, bias=bias)
        self._normalization = normalization

    def make_norm(self, width: int) -> nn.Module:
        return build_norm(self._normalization, width, **self._norm_args)

    def residual(
        self, x: torch.Tensor, norm: nn.Module, sublayer: Callable[[torch.Tensor], torch.Tensor]
    ) -> torch.Tensor:
        """x + Sublayer(Norm(x)) (pre-norm) or Norm(x + Sublayer(x)) (post-norm), the output dropped out."""
        if self.pre_norm:
            return x + self.dropout(sublayer(norm(x)))
        return norm(x + self.dropout(sublayer(x)))


class EvolvedEncoderCell(_Cell):
    """The Evolved Transformer's encoder cell (So et al. 2019, Figure 3 left): GLU, the wide and
    convolutional branches, self-attention, feed-forward; called like `TransformerBlock`."""

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        *,
        dropout: float = 0.0,
        bias: bool = True,
        norm: str = "pre",
        normalization: str = "layernorm",
        eps: float = 1e-5,
        spec: AttentionSpec | None = None,
        n_kv_heads: int | None = None,
    ) -> None:
        super().__init__(d_model, dropout=dropout, norm=norm, normalization=normalization, eps=eps, bias=bias)
        d = d_model
        self.norm1, self.glu = self.make_norm(d), nn.Linear(d, 2 * d, bias=bias)
        self.norm2 = self.make_norm(d)
        self.wide = nn.Linear(d, 4 * d, bias=bias)
        self.conv3 = TimeConv(d, d // 2, 3, causal=False, separable=False, bias=bias)
        self.branch_norm = self.make_norm(4 * d)
        self.sep9 = TimeConv(4 * d, d // 2, 9, causal=False, separable=True, bias=bias)
        self.norm3 = self.make_norm(d)
        self.attn = MultiHeadAttention(d, n_heads, dropout=dropout, bias=bias, spec=spec, n_kv_heads=n_kv_heads)
        self.norm4 = self.make_norm(d)
        self.ffn = EvolvedFeedForward(d, activation=F.relu, hidden_norm=None, dropout=dropout, bias=bias)

    def branches(self, h: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
        """Sub-block 2's branches on h `(B, T, C)` (already normalised in pre-norm order); `keep`
        `(B, T, 1)` zeroes padded positions before each convolution."""
        if keep is not None:
            h = h * keep
        left = self.dropout(F.relu(self.wide(h)))  # (B, T, 4C)
        right = self.dropout(F.relu(self.conv3(h)))  # (B, T, C/2)
        h = self.branch_norm(left + pad_channels(right, 4 * self.d_model))
        if keep is not None:
            h = h * keep
        return pad_channels(self.sep9(h), self.d_model)  # (B, T, C)

    def forward(
        self,
        x: torch.Tensor,
        *,
        mask: torch.Tensor | None = None,
        causal: bool = False,
        need_weights: bool = False,
        **unused: object,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x `(B, T, C)` -> `(B, T, C)` and, when asked for, the self-attention weights
        `(B, H, T, T)`. mask: key padding, bool `(B, 1, 1, T)`, True on real tokens."""
        if causal or unused.get("cache") is not None:
            raise ValueError("the evolved encoder cell reads both sides of a position: use the decoder cell")
        keep = None if mask is None else mask[:, 0, 0, :, None].to(x.dtype)  # (B, T, 1)
        x = self.residual(x, self.norm1, lambda h: F.glu(self.glu(h), dim=-1))
        x = self.residual(x, self.norm2, lambda h: self.branches(h, keep))
        weights = []

        def attend(h: torch.Tensor) -> torch.Tensor:
            a, w = self.attn(h, mask=mask, need_weights=need_weights)
            weights.append(w)
            return a

        x = self.residual(x, self.norm3, attend)
        x = self.residual(x, self.norm4, self.ffn)
        return x, weights[0]


@dataclass
class EvolvedCache:
    """One decoder cell's decoding state: the KV caches of its 2H-head and H-head self-attentions
    and the last K − 1 inputs of its three causal convolutions. It counts nothing (the model's
    `ModelCache` does); `select_rows` and `truncate` act on all of them."""

    wide: KVCache
    attn: KVCache
    convs: list[ConvCache]

    def truncate(self, length: int) -> None:
        """`ModelCache.truncate`: refused, as its convolutions' registers refuse it."""
        for part in (self.wide, self.attn, *self.convs):
            part.truncate(length)

    def select_rows(self, index: torch.Tensor, filled: int = 0) -> None:
        """Keep and reorder the rows: row i becomes old row index[i] (beam search); `filled`:
        `KVCache.select_rows`'."""
        for part in (self.wide, self.attn, *self.convs):
            part.select_rows(index, filled)


class EvolvedDecoderCell(_Cell):
    """The Evolved Transformer's decoder cell (So et al. 2019, Figure 3 right): 2H-head
    self-attention beside cross-attention, the causal separable convolutions, self-attention,
    cross-attention, a Swish feed-forward. `cross=False` drops the two cross-attentions: the cell
    of a causal language model. Called like `DecoderBlock` (`cross`) or `TransformerBlock`."""

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        *,
        cross: bool,
        dropout: float = 0.0,
        bias: bool = True,
        norm: str = "pre",
        normalization: str = "layernorm",
        eps: float = 1e-5,
        spec: AttentionSpec | None = None,
        n_kv_heads: int | None = None,
    ) -> None:
        super().__init__(d_model, dropout=dropout, norm=norm, normalization=normalization, eps=eps, bias=bias)
        d, kw = d_model, dict(dropout=dropout, bias=bias, n_kv_heads=n_kv_heads)
        self.norm1 = self.make_norm(d)
        self.wide_attn = MultiHeadAttention(d, 2 * n_heads, spec=spec, **kw)
        self.first_cross_attn = MultiHeadAttention(d, n_heads, **kw) if cross else None
        self.norm2 = self.make_norm(d)
        self.sep11 = TimeConv(d, 2 * d, 11, causal=True, separable=True, bias=bias)
        self.sep7 = TimeConv(d, d // 2, 7, causal=True, separable=True, bias=bias)
        self.branch_norm = self.make_norm(2 * d)
        self.sep7_out = TimeConv(2 * d, d, 7, causal=True, separable=True, bias=bias)
        self.norm3 = self.make_norm(d)
        self.attn = MultiHeadAttention(d, n_heads, spec=spec, **kw)
        self.norm4 = self.make_norm(d) if cross else None
        self.cross_attn = MultiHeadAttention(d, n_heads, **kw) if cross else None
        self.norm5 = self.make_norm(d)
        self.ffn = EvolvedFeedForward(
            d, activation=F.silu, hidden_norm=self.make_norm(4 * d), dropout=dropout, bias=bias
        )

    def convs(self) -> tuple[TimeConv, TimeConv, TimeConv]:
        return self.sep11, self.sep7, self.sep7_out

    def new_cache(
        self,
        batch_size: int,
        max_len: int,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> EvolvedCache:
        """An empty `EvolvedCache` for `batch_size` rows of up to `max_len` positions."""
        kw = dict(device=device, dtype=dtype)

        def kv(attn: MultiHeadAttention) -> KVCache:
            return KVCache(batch_size, attn.n_kv_heads, max_len, attn.head_dim, **kw)

        convs = [ConvCache(batch_size, c.kernel, c.d_in, **kw) for c in self.convs()]
        return EvolvedCache(kv(self.wide_attn), kv(self.attn), convs)

    def project_memory(self, memory: torch.Tensor) -> tuple[tuple[torch.Tensor, torch.Tensor], ...]:
        """The encoder output `(B, S, C)` projected once for each cross-attention (sub-blocks 1 and 4)."""
        return self.first_cross_attn.project_memory(memory), self.cross_attn.project_memory(memory)

    def branches(
        self, h: torch.Tensor, cache: EvolvedCache | None, positions: int | torch.Tensor | None
    ) -> torch.Tensor:
        """Sub-block 2's causal branches on h `(B, T, C)`, each convolution reading its cache when given."""
        c = [None] * 3 if cache is None else cache.convs
        left = self.dropout(F.relu(self.sep11(h, c[0], positions)))  # (B, T, 2C)
        right = self.dropout(self.sep7(h, c[1], positions))  # (B, T, C/2)
        h = self.branch_norm(left + pad_channels(right, 2 * self.d_model))
        return self.sep7_out(h, c[2], positions)  # (B, T, C)

    def forward(
        self,
        x: torch.Tensor,
        memory_kv: tuple[tuple[torch.Tensor, torch.Tensor], ...] | None = None,
        *,
        memory_mask: torch.Tensor | None = None,
        causal: bool = True,
        cache: EvolvedCache | None = None,
        positions: int | torch.Tensor | None = None,
        need_weights: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x `(B, T, C)` -> `(B, T, C)` and, when asked for, the weights of sub-block 4's
        cross-attention `(B, H, T, S)` (with memory) or of sub-block 3's self-attention
        `(B, H, T, T)`. memory_kv: `project_memory`'s pair (a cell with cross-attention only);
        memory_mask bool `(B, 1, 1, S)`; cache and positions as in `TransformerBlock.forward`."""
        if not causal:
            raise ValueError("the evolved decoder cell is causal")
        if (memory_kv is None) != (self.cross_attn is None):
            raise ValueError("memory_kv is given exactly when the cell has cross-attention")
        kw = dict(causal=True, positions=positions)
        wide_cache, attn_cache = (None, None) if cache is None else (cache.wide, cache.attn)
        weights = []

        def first(h: torch.Tensor) -> torch.Tensor:
            a = self.wide_attn(h, cache=wide_cache, **kw)[0]
            if memory_kv is None:
                return a
            return a + self.first_cross_attn(h, memory_kv=memory_kv[0], mask=memory_mask)[0]

        def attend(h: torch.Tensor) -> torch.Tensor:
            a, w = self.attn(h, cache=attn_cache, need_weights=need_weights and memory_kv is None, **kw)
            weights.append(w)
            return a

        def cross(h: torch.Tensor) -> torch.Tensor:
            a, w = self.cross_attn(h, memory_kv=memory_kv[1], mask=memory_mask, need_weights=need_weights)
            weights.append(w)
            return a

        x = self.residual(x, self.norm1, first)
        x = self.residual(x, self.norm2, lambda h: self.branches(h, cache, positions))
        x = self.residual(x, self.norm3, attend)
        if memory_kv is not None:
            x = self.residual(x, self.norm4, cross)
        x = self.residual(x, self.norm5, self.ffn)
        return x, weights[-1]
