"""Scaled dot-product attention and multi-head attention (Vaswani et al. 2017, §3.2).

Shape legend: B batch, T time (Tq queries, Tk keys), H heads, D head dim, C model dim.
Masks are boolean, `True` = may attend (see `attnlab.nn.masks`).

References:
- "Attention Is All You Need", Eq. 1 (scaled dot-product) and §3.2.2 (multi-head).
- gpt-fast: an explicit, preallocated KV cache object for incremental decoding.
"""

from collections.abc import Callable, Iterable
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.nn.formula import attention_weights
from attnlab.nn.masks import causal_mask
from attnlab.nn.norms import build_norm
from attnlab.nn.sparse import window_rule
from attnlab.nn.variants import AttentionSpec


def scaled_dot_product_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    dropout_p: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(q kᵀ / √D) v, written out as Eq. 1 of the paper.

    q `(..., Tq, D)`, k `(..., Tk, D)`, v `(..., Tk, Dv)`; mask bool broadcastable to
    `(..., Tq, Tk)`, `True` = may attend. Returns `(out (..., Tq, Dv), weights (..., Tq, Tk))`.
    The weights are those of the softmax, before dropout. A query whose keys are all masked gets
    zero weights and a zero output, never NaN.
    """
    weights = attention_weights(q, k, mask)
    applied = F.dropout(weights, dropout_p) if dropout_p > 0.0 else weights
    return applied @ v, weights


class CachedKeys(NamedTuple):
    """What a layer's cache gives attention after a write (`KVCache.update`), the same for every
    cache, one new token or many: the keys and values the new queries attend to, `(B, H, Tk, D)`,
    their positions and which of them each query sees."""

    k: torch.Tensor
    v: torch.Tensor
    positions: torch.Tensor | None
    """The keys' positions `(Tk,)` long, or `(B, Tk)` where rows differ (negative: a slot the row
    has not reached); None where key i sits at position i."""
    mask: torch.Tensor | None
    """bool `(Tq, Tk)` or `(B, 1, Tq, Tk)`, `True` = may attend; None where each query sees every
    key up to its own position (the look-ahead rule, which the caller's `causal` applies)."""


class KVCache:
    """Preallocated keys and values of one attention layer, for incremental decoding (gpt-fast's
    `KVCache`).

    The buffers `k` and `v` are `(B, H, max_len, D)` (H: the layer's key/value heads); the fused
    C++ steps (`attnlab.accel.fused`) read and write them in this layout. A layer's cache counts
    nothing: it writes where it is told (`update`), and the model's `ModelCache` holds the one
    count of positions written. `select_rows` reorders the rows (beam search) and `view_rows`
    shares a range of them (continuous batching).
    """

    window: int | None = None
    """The ring's width (`RollingKVCache`); None: every position has a slot of its own."""

    def __init__(
        self,
        batch_size: int,
        n_heads: int,
        max_len: int,
        head_dim: int,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        shape = (batch_size, n_heads, max_len, head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self._spare: tuple[torch.Tensor, torch.Tensor] | None = None  # for `select_rows`, made on first use

    @property
    def max_len(self) -> int:
        return self.k.size(2)

    def update(self, positions: int | torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> CachedKeys:
        """Write k, v `(B, H, T, D)` at `positions` in place; return what the new queries attend
        to (`CachedKeys`).

        positions:
        - an int p: the slots p … p+T−1 of every row (eager decoding, which grows the cache: p is
          the model's `ModelCache.length`). The return is the slots 0 … p+T−1 under the look-ahead
          rule: attending to them alone costs less than a mask over the whole buffer, and shapes
          that change every step cost nothing eagerly.
        - a long tensor `(T,)`, the same for every row, or `(B, T)`, each row its own (continuous
          batching, where the sequences of a batch started at different times): the static-shape
          path. The return is the whole buffers `(B, H, max_len, D)`, each query seeing the slots
          up to its own position (slots not written hold zeros or an earlier sequence's leftovers).
          Every decoding step sees the same shapes and the positions are a tensor rather than a
          Python int, so a compiled step is compiled once and the loop never waits on the device.
        """
        if isinstance(positions, int):
            end = positions + k.size(2)
            if end > self.max_len:
                raise ValueError(f"KV cache overflow: {end} positions > max_len {self.max_len}")
            self.k[:, :, positions:end] = k
            self.v[:, :, positions:end] = v
            return CachedKeys(self.k[:, :, :end], self.v[:, :, :end], None, None)
        if positions.dim() == 2:
            index = positions[:, None, :, None].expand(-1, k.size(1), -1, k.size(3))  # (B, H, T, D)
            self.k.scatter_(2, index, k.to(self.k.dtype))
            self.v.scatter_(2, index, v.to(self.v.dtype))
        else:
            self.k.index_copy_(2, positions, k.to(self.k.dtype))
            self.v.index_copy_(2, positions, v.to(self.v.dtype))
        visible = torch.arange(self.max_len, device=k.device) <= positions[..., None]  # (Tq, S) or (B, Tq, S)
        return CachedKeys(self.k, self.v, None, visible[:, None] if visible.dim() == 3 else visible)

    def serves(self, pattern: object) -> None:
        """Raise ValueError where this cache cannot hold the keys of attention with `pattern`
        (every pattern reads a cache that keeps every key)."""

    def view_rows(self, rows: slice, length: int | None = None) -> "KVCache":
        """A cache over `rows` and the first `length` slots (default all) of this one's buffers,
        `(len(rows), H, length, D)`, sharing their memory: what `update` writes through it lands
        here. Continuous batching prefills some rows and runs each step over the rows in use and
        the slots filled so far, without copying."""
        length = self.max_len if length is None else length
        part = KVCache.__new__(KVCache)
        part.k, part.v, part._spare = self.k[rows, :, :length], self.v[rows, :, :length], None
        return part

    def truncate(self, length: int) -> None:
        """Check that the slots from `length` on can be forgotten (`ModelCache.truncate`):
        a cache that keeps every key writes over them as they refill."""

    def select_rows(self, index: torch.Tensor, filled: int = 0) -> None:
        """Keep and reorder the rows: row i becomes old row index[i], index `(B',)` long (beam
        search follows its hypotheses). The buffers become `(B', H, max_len, D)`.

        With a count of filled slots (`filled`, the model's `ModelCache.length` on the growing
        path) only those are moved: beam search reorders at every step, and copying the whole
        preallocated buffer each time would make a step cost O(max_len) instead of O(filled).
        Without a count (0: the static path) the whole buffers are moved."""
        n = min(filled, self.max_len) or self.max_len
        # Select into other buffers rather than select and copy back (the faster for beam
        # search's many rows, docs/history.md). Their slots past n are never read: the growing
        # path attends to the filled ones, and without a count n is the whole buffer.
        if index.numel() == self.k.size(0):  # same number of rows: swap with a spare pair
            if self._spare is None:
                self._spare = (torch.empty_like(self.k), torch.empty_like(self.v))
            k, v = self._spare
            self._spare = (self.k, self.v)
        else:  # rows dropped (finished sentences) or added
            k = self.k.new_empty((index.numel(), *self.k.shape[1:]))
            v = self.v.new_empty((index.numel(), *self.v.shape[1:]))
            self._spare = None
        torch.index_select(self.k[:, :, :n], 0, index, out=k[:, :, :n])
        torch.index_select(self.v[:, :, :n], 0, index, out=v[:, :, :n])
        self.k, self.v = k, v


class RollingKVCache(KVCache):
    """The keys and values of one causal window-attention layer in a ring of `window` slots
    (Mistral's rolling buffer cache, Jiang et al. 2023, §2): position p lives in slot p mod window.
    Memory is O(window) and a step reads at most window keys, however long the sequence.

    A query at position p sees the keys p − w + 1 … p (`attnlab.nn.sparse.window_rule`), exactly
    those the ring holds once p is written, so the logits are those of a cache that keeps every
    key, masked to the window. The slots do not store their positions: slot s holds
    q − ((q − s) mod w), q the newest position written; a negative one is a slot this sequence
    has not reached (zeros, or an earlier sequence's leftovers in continuous batching), which
    `update`'s mask hides. `max_len` is the slots held (the window, or fewer in a view).
    """

    def __init__(
        self,
        batch_size: int,
        n_heads: int,
        window: int,
        head_dim: int,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__(batch_size, n_heads, window, head_dim, device=device, dtype=dtype)
        self.window = window

    def truncate(self, length: int) -> None:
        """Not for a ring: the slots that newer positions overwrote cannot be brought back."""
        raise ValueError("a rolling KV cache cannot be truncated: its ring has overwritten older keys")

    def serves(self, pattern: object) -> None:
        if getattr(pattern, "window", None) != self.window:
            raise ValueError(f"a rolling cache of {self.window} slots serves window attention that wide alone")

    def update(self, positions: int | torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> CachedKeys:
        """Write k, v `(B, H, T, D)` at `positions` (as `KVCache.update`: an int p for p … p+T−1,
        or a long tensor `(T,)` or `(B, T)`, consecutive in each row); return the keys and values
        the new queries attend to, with their positions and the window's mask (`CachedKeys`).

        One new position (a decoding step) is written first and the ring returned: the slot it
        takes held the position w before it, which no window reaches any more. Several (a prompt)
        would overwrite keys that the earlier of them still see, so they get the ring as it was
        followed by the new keys, `(B, H, slots + T, D)`, and only the last w are written."""
        t = k.size(2)
        n = self._slots_read(positions, t)
        k_pos, sees = self._visible(positions, t, n)
        if t == 1:
            self._write(positions, k, v)
            return CachedKeys(self.k[:, :, :n], self.v[:, :, :n], k_pos, sees)
        keys = torch.cat([self.k[:, :, :n], k.to(self.k.dtype)], dim=2)  # a copy: the ring may now change
        values = torch.cat([self.v[:, :, :n], v.to(self.v.dtype)], dim=2)
        self._write(positions, k, v)
        return CachedKeys(keys, values, k_pos, sees)

    def _slots_read(self, positions: int | torch.Tensor, t: int) -> int:
        """How many slots `update` returns: all of them for tensor positions (static shapes); on
        the growing path only those written so far, up to the newest position before the new keys
        (or the new key itself, alone)."""
        if not isinstance(positions, int):
            return self.max_len
        return min(positions + (1 if t == 1 else 0), self.max_len)

    def _write(self, positions: int | torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write the last min(T, window) new keys and values into their slots (position mod window)."""
        t, m = k.size(2), min(k.size(2), self.window)
        k, v = k[:, :, t - m :].to(self.k.dtype), v[:, :, t - m :].to(self.v.dtype)
        if isinstance(positions, int):  # two slices: up to the ring's end, then on from its start
            start = (positions + t - m) % self.window
            head = min(m, self.window - start)
            self.k[:, :, start : start + head], self.v[:, :, start : start + head] = k[:, :, :head], v[:, :, :head]
            self.k[:, :, : m - head], self.v[:, :, : m - head] = k[:, :, head:], v[:, :, head:]
            return
        slots = positions[..., -m:] % self.window  # (m,) or (B, m)
        if slots.dim() == 2:
            index = slots[:, None, :, None].expand(-1, k.size(1), -1, k.size(3))  # (B, H, m, D)
            self.k.scatter_(2, index, k)
            self.v.scatter_(2, index, v)
        else:
            self.k.index_copy_(2, slots, k)
            self.v.index_copy_(2, slots, v)

    def _visible(self, positions: int | torch.Tensor, t: int, n: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The positions of the keys `update` returns for t new keys after n slots, `(Tk,)` long
        or `(B, Tk)` for per-row positions, and which of them each query sees: bool `(Tq, Tk)` or
        `(B, 1, Tq, Tk)`, the causal window (`window_rule`); None where it sees them all (one new
        position on the growing path, which returns the filled slots)."""
        device = self.k.device
        queries = torch.arange(positions, positions + t, device=device) if isinstance(positions, int) else positions
        newest = queries[..., :1] - (0 if t == 1 else 1)  # the newest position the returned slots hold
        slots = torch.arange(n, device=device)
        held = newest - torch.remainder(newest - slots, self.window)  # (Tk,) or (B, Tk)
        if t == 1 and isinstance(positions, int):
            return held, None
        keys = held if t == 1 else torch.cat([held, queries], dim=-1)
        k_pos = keys[..., None, :]  # (1, Tk) or (B, 1, Tk)
        sees = window_rule(queries[..., :, None], k_pos, self.window, causal=True) & (k_pos >= 0)
        return keys, (sees[:, None] if sees.dim() == 3 else sees)

    def view_rows(self, rows: slice, length: int | None = None) -> "RollingKVCache":
        """`KVCache.view_rows`: the rows, and the first `length` slots (at most the ring's): while
        no row has reached position `length`, the later slots hold nothing of theirs."""
        length = self.max_len if length is None else min(length, self.max_len)
        part = RollingKVCache.__new__(RollingKVCache)
        part.k, part.v = self.k[rows, :, :length], self.v[rows, :, :length]
        part._spare, part.window = None, self.window
        return part


class ModelCache(list):
    """A model's decoding cache: one cache per layer (`cache[i]` is layer i's: a `KVCache`, a
    `RollingKVCache`, a convolution's or an evolved cell's) and one count of the positions written,
    `length` (nanochat's engine keeps one `pos` for the model in the same way). The model reads
    `length` as the new tokens' first position, hands it to every layer, and advances it once a
    forward on the growing path; the layers count nothing. The static path (positions given as a
    tensor) leaves it alone: the caller knows the positions."""

    def __init__(self, layers: Iterable = (), length: int = 0) -> None:
        super().__init__(layers)
        self.length = length

    def truncate(self, length: int) -> None:
        """Forget every position from `length` on (speculative decoding drops the keys of rejected
        draft tokens): the growing path attends to the first `length` slots and writes after them.
        The buffers are left as they are; the slots past `length` are overwritten as they refill.
        ValueError where a layer cannot (a ring)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"can truncate to 0 … {self.length} filled slots, got {length}")
        for layer in self:
            layer.truncate(length)
        self.length = length

    def reset(self) -> None:
        """Start again from an empty sequence (the buffers are overwritten as they fill)."""
        self.length = 0

    def select_rows(self, index: torch.Tensor) -> None:
        """Keep and reorder every layer's rows: row i becomes old row index[i] (beam search)."""
        for layer in self:
            layer.select_rows(index, self.length)

    def view_rows(self, rows: slice, length: int | None = None) -> "ModelCache":
        """Every layer's `view_rows(rows, length)`, sharing the buffers, with a count of its own
        (0: set it where the views continue a sequence)."""
        return ModelCache(layer.view_rows(rows, length) for layer in self)


class MultiHeadAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W_O, head_i = Attention(Q W_Q^i, K W_K^i, V W_V^i).

    The per-head projections W_Q^i, W_K^i, W_V^i are stored stacked in one `in_proj` of shape
    `(3C, C)` (the layout of `torch.nn.MultiheadAttention`): self-attention projects q, k, v with
    one matmul; cross-attention projects the queries with the first C rows and the memory with the
    rest.

    The explicit path materialises the weights (needed when they are returned); otherwise the fused
    `torch.nn.functional.scaled_dot_product_attention` kernel runs. Both compute the same function.

    `spec` (self-attention only) picks a position scheme that acts inside attention (rotary, ALiBi,
    relative: `self.positions`) and a pattern of keys other than all of them (window, BigBird,
    Linformer: `self.pattern`); the default is the paper's attention.

    `n_kv_heads` < `n_heads` is grouped-query attention (Ainslie et al. 2023; 1 is multi-query
    attention, Shazeer 2019): consecutive groups of n_heads / n_kv_heads query heads share one key
    and value head. `in_proj` then has `C + 2 n_kv_heads D` rows `[q; k; v]`, and a KV cache holds
    the shared heads alone.
    """

    prefer_formula: Callable[[torch.Tensor, int], bool] | None = None
    """Set from outside, where the model is prepared for its hardware (`attnlab.accel.rules`): given
    the queries `(B, H, Tq, D)` and the number of keys, whether the formula's three products beat
    PyTorch's fused kernel for this step. None: the fused kernel wherever it computes the function
    (the reference code asks nothing of the hardware)."""

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        *,
        dropout: float = 0.0,
        bias: bool = True,
        spec: AttentionSpec | None = None,
        n_kv_heads: int | None = None,
    ) -> None:
        super().__init__()
        spec = spec or AttentionSpec()
        if spec.head_size is None and d_model % n_heads != 0:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads})")
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        if n_kv_heads < 1 or n_heads % n_kv_heads != 0:
            raise ValueError(f"n_kv_heads ({n_kv_heads}) must divide n_heads ({n_heads})")
        self.d_model = d_model
        self.n_heads = n_heads
        self.n_kv_heads = n_kv_heads
        self.head_dim = spec.head_size or d_model // n_heads
        self.q_dim = n_heads * self.head_dim  # d_model unless the heads are sized apart (head_size)
        self.kv_dim = n_kv_heads * self.head_dim
        self.dropout = dropout
        self.scale = spec.scale  # None: 1/√D
        qkv_bias = bias if spec.qkv_bias is None else spec.qkv_bias
        self.in_proj = nn.Linear(d_model, self.q_dim + 2 * self.kv_dim, bias=qkv_bias)
        self.out_proj = nn.Linear(self.q_dim, d_model, bias=bias)
        # Qwen3's and Gemma 3's norm over each head's queries and keys, before positions act.
        self.q_norm = build_head_norm(spec.qk_norm, self.head_dim, spec.qk_norm_eps)
        self.k_norm = build_head_norm(spec.qk_norm, self.head_dim, spec.qk_norm_eps)
        self.positions = spec.build_positions(n_heads, self.head_dim)
        self.pattern = spec.build_pattern(n_heads, self.head_dim)

    def _split_heads(self, x: torch.Tensor) -> torch.Tensor:
        b, t, width = x.shape
        return x.view(b, t, width // self.head_dim, self.head_dim).transpose(1, 2)  # (B, H or Hkv, T, D)

    def _share(self, kv: torch.Tensor) -> torch.Tensor:
        """Shared key or value heads `(B, Hkv, T, D)` -> one per query head `(B, H, T, D)`."""
        group = self.n_heads // self.n_kv_heads
        if group == 1:
            return kv
        b, h, t, d = kv.shape
        return kv[:, :, None].expand(b, h, group, t, d).reshape(b, h * group, t, d)

    def project(
        self,
        x: torch.Tensor,
        memory: torch.Tensor | None = None,
        memory_kv: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The queries `(B, H, Tq, D)` of x `(B, Tq, C)`, and the keys and values `(B, Hkv, Tk, D)`:
        of x itself (self-attention, one product by the stacked `in_proj`), or of the memory."""
        if memory is None and memory_kv is None:
            q, k, v = self.in_proj(x).split((self.q_dim, self.kv_dim, self.kv_dim), dim=-1)
            q, k = (
                self._norm_heads(self._split_heads(q), self.q_norm),
                self._norm_heads(self._split_heads(k), self.k_norm),
            )
            return q, k, self._split_heads(v)
        k, v = memory_kv if memory_kv is not None else self.project_memory(memory)
        return self._norm_heads(self._split_heads(self.project_query(x)), self.q_norm), k, v

    @staticmethod
    def _norm_heads(x: torch.Tensor, norm: nn.Module | None) -> torch.Tensor:
        return x if norm is None else norm(x)

    cross_linear = staticmethod(F.linear)
    """The product by a slice of `in_proj`'s rows in cross-attention, `(x, weight, bias)` as
    `F.linear` takes them: `attnlab.accel`'s decoding class puts its own route here."""

    def project_query(self, x: torch.Tensor) -> torch.Tensor:
        """Cross-attention's queries `(B, Tq, H·D)` of x `(B, Tq, C)`: the first H·D rows of `in_proj`."""
        c = self.q_dim
        bias = None if self.in_proj.bias is None else self.in_proj.bias[:c]
        return self.cross_linear(x, self.in_proj.weight[:c], bias)

    def project_memory(self, memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values `(B, Hkv, Tk, D)` of an encoder memory `(B, Tk, C)` for cross-attention."""
        c = self.q_dim
        bias = None if self.in_proj.bias is None else self.in_proj.bias[c:]
        k, v = self.cross_linear(memory, self.in_proj.weight[c:], bias).split(self.kv_dim, dim=-1)
        return self._norm_heads(self._split_heads(k), self.k_norm), self._split_heads(v)

    def forward(
        self,
        x: torch.Tensor,
        memory: torch.Tensor | None = None,
        *,
        memory_kv: tuple[torch.Tensor, torch.Tensor] | None = None,
        mask: torch.Tensor | None = None,
        causal: bool = False,
        cache: KVCache | None = None,
        positions: int | torch.Tensor | None = None,
        need_weights: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attend from x `(B, Tq, C)` to itself, or to `memory` `(B, Tk, C)` (cross-attention), in
        three steps: project, update the cache, attend.

        memory_kv: the memory's keys and values `(B, H, Tk, D)` from `project_memory`, computed once
            per source sentence when decoding step by step; replaces `memory`.
        mask: bool, broadcastable to `(B, H, Tq, Tk)`, `True` = may attend.
        causal: add the look-ahead mask (self-attention); with a cache the queries are the newest
            positions of the cached sequence.
        cache: keys and values of earlier positions; the new ones are written at `positions`
            (`KVCache.update`), and the queries attend to what it returns (`CachedKeys`: a
            `RollingKVCache`, for window attention, holds the last window positions alone and
            masks to the window itself).
        positions: with `cache`, where the queries sit in the cached sequence: an int p, the model's
            count (`ModelCache.length`), for p … p+Tq−1 (the growing path); or a long tensor `(Tq,)`,
            each query then attending to the whole preallocated cache up to its own position (static
            shapes; `causal` is then implied). `(B, Tq)`: each row at its own positions (continuous
            batching); position schemes that act on the scores (ALiBi, relative) and sparse patterns
            take `(Tq,)` only.
        Returns `(out (B, Tq, C), weights (B, H, Tq, Tk) or None)`; weights only when asked for.
        """
        q, k, v = self.project(x, memory, memory_kv)
        q, k, q_pos = self._place(q, k, cache, positions, self_attention=memory is None and memory_kv is None)
        may_empty_rows = mask is not None  # the caller's mask alone can hide all of a query's keys
        k_pos = None  # the keys' positions, where they are not 0 … Tk − 1 (a rolling cache's ring)
        if cache is not None:
            k, v, mask, causal, k_pos = self._update_cache(cache, k, v, positions, mask, causal)
        k, v = self._share(k), self._share(v)
        if self.pattern is not None and q_pos is not None and k_pos is None:
            flags = (causal, cache is not None, may_empty_rows, need_weights)
            y, weights = self._attend_pattern(q, k, v, q_pos, mask, *flags)
        else:
            y, weights = self.attend(q, k, v, q_pos, mask, causal, may_empty_rows, need_weights, k_pos)
        return self.out_proj(self._merge_heads(y)), weights

    def _place(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        cache: KVCache | None,
        positions: int | torch.Tensor | None,
        *,
        self_attention: bool,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The queries' positions in their sequence, and q and k rotated by them (rotary positions),
        where a scheme or pattern inside attention needs them (self-attention's alone). Returns the
        positions the score terms and patterns still need: None once per-row positions `(B, Tq)`
        have rotated q and k, which is all they may do."""
        if cache is not None and positions is None:
            raise ValueError("a cache takes the new tokens' positions: the model's count (an int) or a tensor")
        if not self_attention or (self.positions is None and self.pattern is None):
            return q, k, None
        q_pos = self._query_positions(q.size(2), positions, q.device)
        if q_pos.dim() == 2:
            self._check_row_positions(rolling=cache is not None and cache.window is not None)
        if self.positions is not None:  # rotary: the keys enter the cache rotated
            # Per-row positions (B, T) rotate as (B, 1, T): every head of a row alike.
            q, k = self.positions.rotate(q, k, q_pos if q_pos.dim() == 1 else q_pos[:, None])
            q_pos = None if q_pos.dim() == 2 else q_pos
        return q, k, q_pos

    def _update_cache(
        self,
        cache: KVCache,
        k: torch.Tensor,
        v: torch.Tensor,
        positions: int | torch.Tensor,
        mask: torch.Tensor | None,
        causal: bool,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, bool, torch.Tensor | None]:
        """Write the new keys and values to the cache at `positions` (`KVCache.update`); return
        every key and value to attend to, the mask and causal flag that attending then takes, and
        the keys' positions where they are not their slots (a ring). Where the cache masks (the
        static path's visibility, a ring's window), its mask replaces the look-ahead rule."""
        cache.serves(self.pattern)
        seen = cache.update(positions, k, v)
        if seen.mask is None:
            return seen.k, seen.v, mask, causal, seen.positions
        return seen.k, seen.v, (seen.mask if mask is None else mask & seen.mask), False, seen.positions

    def _attend_pattern(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        q_pos: torch.Tensor,
        mask: torch.Tensor | None,
        causal: bool,
        cached: bool,
        may_empty_rows: bool,
        need_weights: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attention through the pattern, `(y (B, H, Tq, D), weights or None)`: its blocked
        computation over the whole sequence (which scales scores by 1/√D); for a few queries
        against a cache, or where the weights are asked for, its keys as a mask, over the
        pattern's own logits where it has them (`AttentionPattern.attend_at`: the synthesizers')
        or the dot product's (`attend`)."""
        dropout_p = self.dropout if self.training else 0.0
        if not cached and not need_weights and self.scale is None:
            padding = _key_padding(mask, q.size(0), k.size(2))
            y = self.pattern(q, k, v, causal=causal, key_padding=padding, terms=self.positions, dropout_p=dropout_p)
            return y, None
        sees = self.pattern.key_mask(q_pos, k.size(2), causal=causal or cached)  # (Tq, Tk)
        mask = sees if mask is None else mask & sees
        own = self.pattern.attend_at(q, k, v, q_pos, mask, self.positions, dropout_p)
        if own is None:
            return self.attend(q, k, v, q_pos, mask, causal, may_empty_rows, need_weights)
        return own[0], (own[1] if need_weights else None)

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        q_pos: torch.Tensor | None,
        mask: torch.Tensor | None,
        causal: bool,
        may_empty_rows: bool,
        need_weights: bool,
        k_pos: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """softmax(q kᵀ / √D + bias) v for q `(B, H, Tq, D)`, k and v `(B, H, Tk, D)`: the formula,
        or PyTorch's fused kernel (the same function) where no weights and no value term are
        needed. k_pos: the keys' positions `(Tk,)`, by default 0 … Tk − 1. Returns
        `(y (B, H, Tq, D), weights (B, H, Tq, Tk) or None)`."""
        t_q, t_k = q.size(2), k.size(2)
        dropout_p = self.dropout if self.training else 0.0
        score_bias, value_bias = None, False
        if self.positions is not None and q_pos is not None:
            k_pos = torch.arange(t_k, device=q.device) if k_pos is None else k_pos
            q_pos, k_pos = q_pos[:, None], k_pos[None, :]  # (Tq, 1), (1, Tk)
            score_bias = self.positions.score_bias(q, q_pos, k_pos)
            value_bias = not self.positions.sdpa_allowed  # a term from the weights: the formula's path
        # In a compiled one-query step the formula's few operators fuse into the kernels around
        # them, where the fused kernel is one more call with its fixed cost (docs/history.md).
        faster = self.prefer_formula is not None and self.prefer_formula(q, t_k)
        formula = need_weights or value_bias or (t_q == 1 and torch.compiler.is_compiling()) or faster
        # A square causal problem has a dedicated flag in the fused kernel; anything else needs
        # the mask written out.
        fused_causal = causal and mask is None and score_bias is None and t_q == t_k and not formula
        if causal and not fused_causal and t_q > 1:
            look_ahead = causal_mask(t_q, t_k, device=q.device)
            mask = look_ahead if mask is None else mask & look_ahead
        if formula:
            weights = attention_weights(q, k, mask, score_bias, scale=self.scale)
            applied = F.dropout(weights, dropout_p) if dropout_p > 0.0 else weights
            y = applied @ v
            if value_bias:
                y = y + self.positions.value_bias(applied, q_pos, k_pos)
            return y, (weights if need_weights else None)
        attn_mask = mask
        if score_bias is not None:  # a float mask: the bias, and -inf where a key is hidden
            attn_mask = score_bias if mask is None else score_bias.masked_fill(~mask, float("-inf"))
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=fused_causal, scale=self.scale
        )
        if may_empty_rows:
            # Fully masked rows: the fused kernel may give NaN; the formula's answer is zero.
            y = y.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)
        return y, None

    def _check_row_positions(self, rolling: bool) -> None:
        """Per-row query positions reach rotary positions only: the score terms of ALiBi and
        relative positions and the sparse patterns take one set of positions for the batch (a
        window over a rolling cache excepted: the cache masks each row's window)."""
        if (self.pattern is not None and not rolling) or (
            self.positions is not None and not self.positions.row_positions
        ):
            raise ValueError(
                "per-row positions (B, T) need full attention with input or rotary positions; "
                "decode this model one sequence at a time"
            )

    def _merge_heads(self, y: torch.Tensor) -> torch.Tensor:
        b, _, t, _ = y.shape
        return y.transpose(1, 2).contiguous().view(b, t, self.q_dim)  # (B, Tq, H·D): concat(head_1..head_h)

    @staticmethod
    def _query_positions(t_q: int, positions: int | torch.Tensor | None, device: torch.device) -> torch.Tensor:
        """The queries' positions `(Tq,)` long in their sequence: given (the static decoding
        step), from the int given (the growing path), or from 0."""
        if isinstance(positions, torch.Tensor):
            return positions
        start = positions or 0
        return torch.arange(start, start + t_q, device=device)


def build_head_norm(kind: str, head_dim: int, eps: float) -> nn.Module | None:
    """The norm over each head's D features that `qk_norm` names; None for "none"."""
    if kind == "none":
        return None
    return build_norm(kind, head_dim, eps=eps)


def _key_padding(mask: torch.Tensor | None, batch: int, t_k: int) -> torch.Tensor | None:
    """A key-padding mask `(B, 1, 1, Tk)` (`padding_mask_from_ids`) as `(B, Tk)`, for the attention
    patterns, which take no other mask."""
    if mask is None:
        return None
    if mask.dim() != 4 or mask.shape[1:3] != (1, 1) or mask.size(-1) != t_k:
        raise ValueError(f"attention patterns take a key-padding mask (B, 1, 1, Tk) alone, got {tuple(mask.shape)}")
    return mask[:, 0, 0, :].expand(batch, t_k)
