"""Attention patterns beyond O(T²): sliding window, BigBird, Linformer, and full attention as the reference.

Each pattern is a small module with one interface (`AttentionPattern`), chosen by name through
`PATTERNS` / `build_pattern`. A pattern decides which keys each query sees (`key_mask`) and computes
softmax(q kᵀ / √D + bias) v over exactly those keys (`forward`) without ever building a (T, T) tensor
(except `full`, which is the O(T²) reference).

Shape legend: B batch, H heads, T time, D head dim, Tq queries, Tk keys; in blocked computations nb
blocks, S the block dimension(s) (`*S`), w a window or block length, m key blocks per query block.
Masks are boolean, `True` = may attend (the convention of `attnlab.nn.masks`).

Position terms. `forward` takes an optional `terms` object from a position scheme (ALiBi, Shaw
relative positions) with two methods, called with the true positions of the queries and of the
gathered keys, so that they work inside blocked computations:
    terms.score_bias(q (B, H, *S, Tq, D), q_pos (*S, Tq, 1), k_pos (*S, 1, Tk)) -> Tensor | None
        an additive term broadcastable to the scores (B, H, *S, Tq, Tk), already scaled;
    terms.value_bias(weights (B, H, *S, Tq, Tk), q_pos, k_pos) -> Tensor | None
        a term (B, H, *S, Tq, D) added to weights @ v; the weights are those after softmax and dropout,
        as in Shaw et al. Eq. 3, z_i = Σ_j α_ij (v_j + a_ij).
Positions of keys a query cannot see (block padding, duplicate blocks) are clamped into 0..T-1, so
a scheme that indexes a table by position never reads out of range; their scores are masked anyway.

References:
- Beltagy, Peters, Cohan 2020, "Longformer: The Long-Document Transformer", §3.1 (sliding window).
- Zaheer et al. 2020, "Big Bird: Transformers for Longer Sequences", Figure 1, §2 and App. D
  (block-sparse window + global + random attention, the ITC form).
- Wang et al. 2020, "Linformer: Self-Attention with Linear Complexity", §4 (Eq. 7, headwise sharing).
"""

import functools
import math
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.nn.formula import attention_weights
from attnlab.nn.masks import causal_mask


class PositionTerms(Protocol):
    """What a position scheme hands to attention (see the module docstring for the shapes)."""

    def score_bias(self, q: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor | None: ...

    def value_bias(self, weights: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor | None: ...


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    q_pos: torch.Tensor,
    k_pos: torch.Tensor,
    terms: PositionTerms | None = None,
    dropout_p: float = 0.0,
) -> torch.Tensor:
    """softmax(q kᵀ / √D + score_bias) v + value_bias over the keys `mask` allows, written out.

    q `(B, H, *S, Tq, D)`, k and v `(B, H, *S, Tk, D)`; mask bool broadcastable to `(B, H, *S, Tq, Tk)`
    or None; q_pos long broadcastable to `(*S, Tq, 1)`, k_pos to `(*S, 1, Tk)`: the true positions,
    handed to `terms`. Returns `(B, H, *S, Tq, D)`. A query that sees no key gets a zero output.
    """
    bias = None if terms is None else terms.score_bias(q, q_pos, k_pos)
    weights = attention_weights(q, k, mask, bias)  # (B, H, *S, Tq, Tk)
    if dropout_p > 0.0:
        weights = F.dropout(weights, dropout_p)
    y = weights @ v  # (B, H, *S, Tq, D)
    extra = None if terms is None else terms.value_bias(weights, q_pos, k_pos)
    return y if extra is None else y + extra


def _check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_padding: torch.Tensor | None) -> None:
    """Self-attention over one sequence: q and k `(B, H, T, D)`, v `(B, H, T, Dv)`, key_padding `(B, T)` bool."""
    if q.dim() != 4 or q.shape != k.shape or v.shape[:3] != k.shape[:3]:
        raise ValueError(
            f"q, k, v must be (B, H, T, D) of one sequence, got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if key_padding is not None and (key_padding.dtype != torch.bool or key_padding.shape != (q.size(0), q.size(2))):
        raise ValueError(
            f"key_padding must be bool (B, T) = {(q.size(0), q.size(2))}, got {key_padding.dtype} "
            f"{tuple(key_padding.shape)}"
        )


def _blocks(x: torch.Tensor, length: int, before: int = 0, value: float | bool = 0.0) -> torch.Tensor:
    """x `(..., T, D)` padded with `before` rows of `value` in front and more at the end, to `length` rows."""
    return F.pad(x, (0, 0, before, length - before - x.size(-2)), value=value)


@dataclass(frozen=True)
class PatternOptions:
    """The arguments of `build_pattern`; each pattern takes what it needs (`AttentionPattern.from_options`)."""

    n_heads: int
    head_dim: int
    max_len: int  # the longest sequence (linformer's E, F have this many columns)
    window: int  # keys per query of the sliding window
    block: int  # bigbird's block length
    global_blocks: int  # bigbird: the first this many blocks are global
    random_blocks: int  # bigbird: random key blocks per query block
    linformer_k: int  # linformer: rows of the projected keys and values
    seed: int  # bigbird: seeds the random blocks


class AttentionPattern(nn.Module):
    """Which keys each query sees, and attention over exactly those keys. See the module docstring."""

    causal_ok: bool = True
    """Whether the pattern can serve a causal (decoder) model."""

    @classmethod
    def from_options(cls, options: PatternOptions) -> "AttentionPattern":
        """The pattern built from the options it uses."""
        return cls()

    def check(self, t: int, causal: bool) -> None:
        """Raise ValueError (one line) when the pattern cannot run on a sequence of length t."""
        if t < 1:
            raise ValueError(f"{type(self).__name__} needs a sequence of at least one position, got {t}")
        if causal and not self.causal_ok:
            raise ValueError(f"{type(self).__name__} cannot be causal")

    def key_mask(self, q_pos: torch.Tensor, t_k: int, *, causal: bool) -> torch.Tensor:
        """bool `(Tq, t_k)`: which keys at positions 0..t_k-1 the queries at positions q_pos `(Tq,)` see."""
        raise NotImplementedError

    def attend_at(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        q_pos: torch.Tensor,
        mask: torch.Tensor | None,
        terms: PositionTerms | None = None,
        dropout_p: float = 0.0,
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Attention of queries at q_pos `(Tq,)` over the keys `mask` allows (its `key_mask`, as a
        mask: a few queries against a KV cache, or the weights asked for), where the pattern's
        logits are its own: `(y (B, H, Tq, D), weights (B, H, Tq, Tk))`. None where they are the dot
        product's, which the attention layer computes itself (every pattern here but the
        synthesizers)."""
        return None

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        causal: bool,
        key_padding: torch.Tensor | None = None,
        terms: PositionTerms | None = None,
        dropout_p: float = 0.0,
    ) -> torch.Tensor:
        """Self-attention of one sequence: q, k, v `(B, H, T, D)` -> y `(B, H, T, D)`.

        key_padding: bool `(B, T)`, `True` = a real key; padding keys are never attended to.
        terms: position terms (module docstring) or None. dropout_p: dropout on the weights.
        """
        _check_inputs(q, k, v, key_padding)
        self.check(q.size(2), causal)
        return self._forward(q, k, v, causal, key_padding, terms, dropout_p)

    def _forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        causal: bool,
        key_padding: torch.Tensor | None,
        terms: PositionTerms | None,
        dropout_p: float,
    ) -> torch.Tensor:
        """`forward` after its checks: the pattern's own computation."""
        raise NotImplementedError


class FullAttention(AttentionPattern):
    """Every query sees every key (its past only, when causal): Vaswani et al. 2017, Eq. 1. The reference.

    Without position terms it runs PyTorch's fused kernel; with them, the formula.
    """

    def key_mask(self, q_pos: torch.Tensor, t_k: int, *, causal: bool) -> torch.Tensor:
        k_pos = torch.arange(t_k, device=q_pos.device)
        if causal:
            return k_pos[None, :] <= q_pos[:, None]
        return torch.ones(q_pos.numel(), t_k, dtype=torch.bool, device=q_pos.device)

    def _forward(self, q, k, v, causal, key_padding, terms, dropout_p):
        t = q.size(2)
        mask = None if key_padding is None else key_padding[:, None, None, :]  # (B, 1, 1, T)
        if causal and (mask is not None or terms is not None):
            # The fused kernel takes a causal flag or a mask, not both; the formula takes a mask.
            look_ahead = causal_mask(t, device=q.device)
            mask = look_ahead if mask is None else mask & look_ahead
        if terms is not None:
            pos = torch.arange(t, device=q.device)
            return attend(q, k, v, mask, pos[:, None], pos[None, :], terms, dropout_p)
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=causal and mask is None
        )
        if mask is not None:
            # Fully masked rows: the fused kernel may give NaN; the formula's answer is zero.
            y = y.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)
        return y


def window_rule(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int, causal: bool) -> torch.Tensor:
    """Which keys a sliding window of `window` keys lets each query see (broadcasting q_pos against k_pos).

    Causal: the last `window` keys, itself included (i - w < j <= i). Bidirectional: |i - j| < w,
    the window centred on the query (Longformer §3.1 with one-sided width w - 1).
    """
    if causal:
        return (k_pos <= q_pos) & (k_pos > q_pos - window)
    return (k_pos - q_pos).abs() < window


class WindowAttention(AttentionPattern):
    """Sliding-window (local) attention: each query sees the keys within `window` positions (`window_rule`).

    Computed in blocks of w = min(window, T) queries: the window of any query in block n lies in
    key blocks n-1 and n (and n+1, bidirectional), so each block attends to those 2w or 3w keys,
    masked to the exact window. Memory and time O(T·w); no (T, T) tensor. T not a multiple of w is
    padded at the end and the padding masked out.
    """

    def __init__(self, window: int) -> None:
        super().__init__()
        if window <= 0:
            raise ValueError(f"window must be a positive number of keys, got {window}")
        self.window = window

    @classmethod
    def from_options(cls, options: PatternOptions) -> "WindowAttention":
        return cls(options.window)

    def extra_repr(self) -> str:
        return f"window={self.window}"

    def key_mask(self, q_pos: torch.Tensor, t_k: int, *, causal: bool) -> torch.Tensor:
        k_pos = torch.arange(t_k, device=q_pos.device)
        return window_rule(q_pos[:, None], k_pos[None, :], self.window, causal)

    def _forward(self, q, k, v, causal, key_padding, terms, dropout_p):
        b, h, t, d = q.shape
        w = min(self.window, t)  # a window as wide as the sequence is the whole sequence: one block
        nb = -(-t // w)
        n_k = 2 if causal else 3  # key blocks per query block: previous, own (, next)
        # Keys shifted by one block, so that padded key block n + i is sequence block n - 1 + i.
        k_len = (nb + n_k - 1) * w

        def windows(x: torch.Tensor, value: float | bool = 0.0) -> torch.Tensor:  # (..., T, D) -> (..., nb, n_k·w, D)
            # Overlapping windows of n_k·w rows, one block apart: a view of the padded rows, no copy.
            return _blocks(x, k_len, before=w, value=value).unfold(-2, n_k * w, w).transpose(-1, -2)

        qb = _blocks(q, nb * w).view(b, h, nb, w, d)  # (B, H, nb, w, D)
        q_pos = torch.arange(nb * w, device=q.device).view(nb, w, 1)
        k_pos = (torch.arange(nb, device=q.device)[:, None] * w + torch.arange(n_k * w, device=q.device) - w)[:, None]
        mask = window_rule(q_pos, k_pos, self.window, causal) & (k_pos >= 0) & (k_pos < t)  # (nb, w, n_k·w)
        if key_padding is not None:
            real = windows(key_padding[..., None], value=False).squeeze(-1)  # (B, nb, n_k·w)
            mask = mask & real[:, None, :, None, :]  # (B, 1, nb, w, n_k·w)
        y = attend(qb, windows(k), windows(v), mask, q_pos.clamp(max=t - 1), k_pos.clamp(0, t - 1), terms, dropout_p)
        return y.flatten(2, 3)[:, :, :t]  # (B, H, T, D)


def _random_blocks(n: int, candidates: list[int], count: int, seed: int) -> list[int]:
    """`count` of `candidates` for query block n, from a generator seeded by (seed, n) alone: the choice
    does not depend on the sequence length beyond what `candidates` does (causal: not at all)."""
    if count >= len(candidates):
        return candidates
    # One stream per (seed, block), by plain arithmetic rather than hash(): the blocks a trained model
    # attends to must not change with the Python version. The CPU generator (mt19937) keeps only the
    # low 32 bits of its seed, so the seed is mixed in below them.
    gen = torch.Generator().manual_seed((seed * 1_000_003 + n) % 2**32)
    picked = torch.randperm(len(candidates), generator=gen)[:count]
    return sorted(candidates[i] for i in picked.tolist())


@functools.lru_cache(maxsize=64)
def bigbird_key_blocks(
    n_blocks: int, *, global_blocks: int, random_blocks: int, seed: int, causal: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """The key blocks each query block attends to in BigBird's block-sparse form (Zaheer et al. App. D).

    Row n lists (a) the window: blocks n-1, n (and n+1, bidirectional); (b) the global blocks
    0..global_blocks-1; (c) `random_blocks` random blocks drawn from those in neither (a) nor (b) and,
    causal, strictly before the window. Returns `(index (nb, m) long, valid (nb, m) bool)`: `valid`
    is False for a block outside 0..nb-1, a missing random block (too few candidates), or a block
    already listed earlier in the row, so that each key is counted once. Invalid entries index block
    0. Cached: callers must not modify the tensors.
    """
    rows = []
    for n in range(n_blocks):
        window = [n - 1, n] if causal else [n - 1, n, n + 1]
        if causal:  # strictly before the window: the choice for block n depends on n alone
            candidates = list(range(global_blocks, n - 1))
        else:
            candidates = [j for j in range(global_blocks, n_blocks) if abs(j - n) > 1]
        chosen = _random_blocks(n, candidates, random_blocks, seed)
        rows.append(window + list(range(global_blocks)) + chosen + [-1] * (random_blocks - len(chosen)))
    index = torch.tensor(rows, dtype=torch.long).view(n_blocks, -1)  # (nb, m)
    seen_before = (index[:, :, None] == index[:, None, :]).tril(diagonal=-1).any(dim=-1)
    valid = (index >= 0) & (index < n_blocks) & ~seen_before
    return index.clamp(0, n_blocks - 1), valid


class BigBirdAttention(AttentionPattern):
    """BigBird (Zaheer et al. 2020, Figure 1; block-sparse ITC form, §2 and App. D).

    The sequence is cut into blocks of `block` positions. Each query block attends to its window
    (own and neighbour blocks), to the first `global_blocks` blocks, and to `random_blocks` random
    blocks (`bigbird_key_blocks`). Bidirectional, the global blocks' queries also attend to every key
    (computed separately: O(g·block·T)). Causal, every query sees only its past: the global queries
    then see all earlier keys, which the window and global blocks already cover.

    T not a multiple of `block` is padded at the end to whole blocks and the padding masked out; the
    block table (and so the random choice) is that of ceil(T / block) blocks. Memory and time
    O(T·m·block) with m = 2 or 3 + global_blocks + random_blocks; no (T, T) tensor.
    """

    def __init__(self, block: int, global_blocks: int, random_blocks: int, *, seed: int = 0) -> None:
        super().__init__()
        if block <= 0:
            raise ValueError(f"block must be a positive number of positions, got {block}")
        if global_blocks < 0 or random_blocks < 0:
            raise ValueError(f"global_blocks and random_blocks must be >= 0, got {global_blocks} and {random_blocks}")
        self.block, self.global_blocks, self.random_blocks, self.seed = block, global_blocks, random_blocks, seed

    @classmethod
    def from_options(cls, options: PatternOptions) -> "BigBirdAttention":
        return cls(options.block, options.global_blocks, options.random_blocks, seed=options.seed)

    def extra_repr(self) -> str:
        return f"block={self.block}, global_blocks={self.global_blocks}, random_blocks={self.random_blocks}"

    def key_blocks(self, n_blocks: int, causal: bool, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """`bigbird_key_blocks` for this pattern, on `device`."""
        index, valid = bigbird_key_blocks(
            n_blocks, global_blocks=self.global_blocks, random_blocks=self.random_blocks, seed=self.seed, causal=causal
        )
        return index.to(device), valid.to(device)

    def key_mask(self, q_pos: torch.Tensor, t_k: int, *, causal: bool) -> torch.Tensor:
        if q_pos.numel() and int(q_pos.max()) >= t_k:
            raise ValueError(f"queries at positions up to {int(q_pos.max())} need t_k > that, got t_k={t_k}")
        nb = -(-t_k // self.block)
        index, valid = self.key_blocks(nb, causal, q_pos.device)
        block_sees = (F.one_hot(index, nb).bool() & valid[..., None]).any(dim=1)  # (nb query blocks, nb key blocks)
        if not causal:
            block_sees[: self.global_blocks] = True  # global queries see every key
        k_pos = torch.arange(t_k, device=q_pos.device)
        mask = block_sees[q_pos // self.block][:, k_pos // self.block]  # (Tq, t_k)
        return mask & (k_pos[None, :] <= q_pos[:, None]) if causal else mask

    def _forward(self, q, k, v, causal, key_padding, terms, dropout_p):
        t, bs = q.size(2), self.block
        nb = -(-t // bs)
        # Bidirectional global query blocks see every key: done apart, against all T keys.
        first = 0 if causal else min(self.global_blocks, nb)
        parts = []
        if first > 0:
            t_g = min(first * bs, t)
            pos = torch.arange(t, device=q.device)
            mask = None if key_padding is None else key_padding[:, None, None, :]  # (B, 1, 1, T)
            parts.append(attend(q[:, :, :t_g], k, v, mask, pos[:t_g, None], pos[None, :], terms, dropout_p))
        if first < nb:
            parts.append(self._blocked(q, k, v, causal, key_padding, terms, dropout_p, first))
        return torch.cat(parts, dim=2)[:, :, :t]  # (B, H, T, D)

    def _blocked(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        causal: bool,
        key_padding: torch.Tensor | None,
        terms: PositionTerms | None,
        dropout_p: float,
        first: int,
    ) -> torch.Tensor:
        """Query blocks first..nb-1 against their key blocks. Returns `(B, H, (nb - first)·block, D)`."""
        b, h, t, d = q.shape
        bs = self.block
        nb = -(-t // bs)
        index, valid = self.key_blocks(nb, causal, q.device)
        index, valid = index[first:], valid[first:]  # (nq, m)

        def gather(x: torch.Tensor, value: float | bool = 0.0) -> torch.Tensor:  # (..., T, D) -> (..., nq, m·bs, D)
            xb = _blocks(x, nb * bs, value=value).unflatten(-2, (nb, bs))  # (..., nb, bs, D)
            return xb[..., index, :, :].flatten(-3, -2)  # (..., nq, m, bs, D) -> (..., nq, m·bs, D)

        arange = torch.arange(bs, device=q.device)
        q_pos = (torch.arange(first, nb, device=q.device)[:, None] * bs + arange)[..., None]  # (nq, bs, 1)
        k_pos = (index[..., None] * bs + arange).flatten(1)[:, None, :]  # (nq, 1, m·bs)
        mask = valid.repeat_interleave(bs, dim=1)[:, None, :] & (k_pos < t)  # (nq, 1, m·bs)
        if causal:
            mask = mask & (k_pos <= q_pos)  # (nq, bs, m·bs)
        if key_padding is not None:
            real = gather(key_padding[..., None], value=False).squeeze(-1)  # (B, nq, m·bs)
            mask = mask & real[:, None, :, None, :]  # (B, 1, nq, bs, m·bs)
        qb = _blocks(q, nb * bs).view(b, h, nb, bs, d)[:, :, first:]  # (B, H, nq, bs, D)
        y = attend(qb, gather(k), gather(v), mask, q_pos.clamp(max=t - 1), k_pos.clamp(max=t - 1), terms, dropout_p)
        return y.flatten(2, 3)


def _refuse_biases(q: torch.Tensor, terms: PositionTerms | None) -> None:
    """Raise ValueError when `terms` brings a score or value bias (asked on a one-query, one-key problem)."""
    if terms is None:
        return
    one = q[:, :, :1, :]  # (B, H, 1, D)
    pos = torch.zeros(1, 1, dtype=torch.long, device=q.device)
    weights = one.new_ones(one.shape[:-1] + (1,))  # (B, H, 1, 1)
    if terms.score_bias(one, pos, pos) is not None or terms.value_bias(weights, pos, pos) is not None:
        raise ValueError("linformer's projected keys have no positions; use rope or absolute positions")


class LinformerAttention(AttentionPattern):
    """Linformer (Wang et al. 2020, Eq. 7): keys and values projected along the sequence to k rows.

    head_i = softmax(q (E K)ᵀ / √D) (F V), with learned E, F `(k, max_len)`, one pair per layer
    shared across heads (the paper's "headwise sharing", §4). A sequence of T < max_len positions
    uses the first T columns. Memory and time O(T·k).

    Every projected row mixes all positions, so the pattern is bidirectional only, and the projected
    keys have no positions: score and value biases (ALiBi, Shaw) are refused; rotary or absolute
    positions, applied before attention, work. Padding keys and values are zeroed before the projection
    (they add nothing to E K and F V; unlike a mask, they do not renormalise the softmax).
    """

    causal_ok = False

    def __init__(self, max_len: int, k: int) -> None:
        super().__init__()
        if max_len <= 0 or k <= 0:
            raise ValueError(f"linformer needs max_len > 0 and k > 0, got max_len={max_len}, k={k}")
        self.max_len, self.k = max_len, k
        # The authors' code (linformer-pytorch, fairseq examples/linformer) draws the projections with
        # std 1/sqrt(k), so that E K keeps the scale of K's rows.
        self.E = nn.Parameter(torch.randn(k, max_len) / math.sqrt(k))
        self.F = nn.Parameter(torch.randn(k, max_len) / math.sqrt(k))

    @classmethod
    def from_options(cls, options: PatternOptions) -> "LinformerAttention":
        return cls(options.max_len, options.linformer_k)

    def extra_repr(self) -> str:
        return f"max_len={self.max_len}, k={self.k}"

    def check(self, t: int, causal: bool) -> None:
        if causal:
            raise ValueError(
                "linformer mixes all positions into k rows, so a causal model cannot use it (use window or bigbird)"
            )
        super().check(t, causal)
        if t > self.max_len:
            raise ValueError(f"linformer was built for at most max_len={self.max_len} positions, got {t}")

    def key_mask(self, q_pos: torch.Tensor, t_k: int, *, causal: bool) -> torch.Tensor:
        raise ValueError("linformer has no key mask: each query sees k projections of all keys, not a subset of them")

    def _forward(self, q, k, v, causal, key_padding, terms, dropout_p):
        t = q.size(2)
        _refuse_biases(q, terms)
        if key_padding is not None:
            real = key_padding[:, None, :, None]  # (B, 1, T, 1)
            k, v = k.masked_fill(~real, 0.0), v.masked_fill(~real, 0.0)
        k_proj = self.E[:, :t].to(k.dtype) @ k  # (k, T) @ (B, H, T, D) -> (B, H, k, D)
        v_proj = self.F[:, :t].to(v.dtype) @ v
        return F.scaled_dot_product_attention(q, k_proj, v_proj, dropout_p=dropout_p)


PATTERNS: dict[str, type[AttentionPattern]] = {
    "full": FullAttention,
    "window": WindowAttention,
    "bigbird": BigBirdAttention,
    "linformer": LinformerAttention,
}


def build_pattern(
    name: str,
    *,
    n_heads: int,
    head_dim: int,
    max_len: int,
    window: int,
    block: int,
    global_blocks: int,
    random_blocks: int,
    linformer_k: int,
    seed: int = 0,
) -> AttentionPattern:
    """The attention pattern called `name` (one of `PATTERNS`), built from the arguments it uses.

    n_heads and head_dim are taken for patterns with per-head parameters; none of these has any
    (Linformer shares E and F across heads). Arguments a pattern does not use are not checked.
    """
    if name not in PATTERNS:
        raise ValueError(f"unknown attention pattern {name!r}; choose one of {sorted(PATTERNS)}")
    options = PatternOptions(n_heads, head_dim, max_len, window, block, global_blocks, random_blocks, linformer_k, seed)
    return PATTERNS[name].from_options(options)
