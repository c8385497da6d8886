"""Synthesizer attention (Tay et al. 2021): attention weights synthesized without token-token dot products.

Each head's logits over the keys come from a function of the query token alone (dense), or from a
learned table indexed by position (random); the softmax of them weights the values as usual:
Y = softmax(B) G(X) (§3, Eq. 2). The "plus" variants add the dot-product logits q kᵀ / √D to the
synthesized ones; "plus alpha" mixes the two with a learned weight α ∈ (0, 1) per head,
softmax(α B + (1 − α) q kᵀ / √D), the paper's mixture of synthesizers (§3.3) with two members, as
Narang et al. 2021 (Table 1) name them.

Every variant is an attention pattern (`attnlab.nn.sparse.AttentionPattern`), chosen by name
(`model.attention = "synthesizer-dense"`, ...). The dense synthesizer reads the head's query
projection q = X W_Q^h (D values) in place of X: F(q) = W₂ ReLU(W₁ q + b₁) + b₂ (Eq. 3) with W₁
`(D, D)` and W₂ `(D, L)` per head, so that it fits behind the patterns' interface, which hands
over q, k and v. Logits are made for L = the model's longest sequence; a sequence of T ≤ L keys
reads the first T. A causal model masks the synthesized logits with the look-ahead mask, like
dot-product logits, so that causal models can use every variant.

Shape legend: B batch, H heads, T time (Tq queries, Tk keys), D head dim, L the longest sequence.

References:
- Tay et al. 2021, "Synthesizer: Rethinking Self-Attention for Transformer Models", §3.1 (dense,
  factorized dense), §3.2 (random), §3.3 (mixtures).
- Narang et al. 2021, "Do Transformer Modifications Transfer Across Implementations and
  Applications?", Table 1 (the seven rows).
"""

import math

import torch
from torch import nn

from attnlab.nn.sparse import AttentionPattern, PatternOptions, PositionTerms

MIXES = ("alone", "plus", "alpha")
"""How the synthesized logits meet the dot product: alone, added to it, mixed by a learned α."""


def _normal(*shape: int, std: float) -> nn.Parameter:
    return nn.Parameter(torch.randn(*shape) * std)


class Synthesizer(AttentionPattern):
    """Logits from `synthesize` (the subclass's), alone or with the dot product (`mix`), over the
    keys a query may see (all of them, or its past when causal)."""

    def __init__(self, n_heads: int, head_dim: int, max_len: int, mix: str = "alone") -> None:
        super().__init__()
        if mix not in MIXES:
            raise ValueError(f"mix must be one of {MIXES}, got {mix!r}")
        self.n_heads, self.head_dim, self.max_len, self.mix = n_heads, head_dim, max_len, mix
        # α = sigmoid(θ): θ = 0 starts each head half synthesized, half dot product.
        self.alpha_logit = nn.Parameter(torch.zeros(n_heads)) if mix == "alpha" else None

    def extra_repr(self) -> str:
        return f"n_heads={self.n_heads}, max_len={self.max_len}, mix={self.mix}"

    def synthesize(self, q: torch.Tensor, q_pos: torch.Tensor, t_k: int) -> torch.Tensor:
        """The synthesized logits broadcastable to `(B, H, Tq, Tk)` of queries q `(B, H, Tq, D)` at
        positions q_pos `(Tq,)`, over keys 0 … t_k − 1."""
        raise NotImplementedError

    def check(self, t: int, causal: bool) -> None:
        super().check(t, causal)
        if t > self.max_len:
            raise ValueError(f"a synthesizer makes logits for at most max_len={self.max_len} keys, got {t}")

    def key_mask(self, q_pos: torch.Tensor, t_k: int, *, causal: bool) -> torch.Tensor:
        k_pos = torch.arange(t_k, device=q_pos.device)
        if causal:
            return k_pos[None, :] <= q_pos[:, None]
        return torch.ones(q_pos.numel(), t_k, dtype=torch.bool, device=q_pos.device)

    def logits(
        self, q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor, terms: PositionTerms | None = None
    ) -> torch.Tensor:
        """The logits `(B, H, Tq, Tk)` before masking: synthesized, plus or mixed with q kᵀ / √D,
        plus a position scheme's score term."""
        t_k = k.size(2)
        if t_k > self.max_len:
            raise ValueError(f"a synthesizer makes logits for at most max_len={self.max_len} keys, got {t_k}")
        scores = self.synthesize(q, q_pos, t_k).to(q.dtype)
        if self.mix != "alone":
            dot = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, H, Tq, Tk)
            if self.mix == "plus":
                scores = scores + dot
            else:
                alpha = torch.sigmoid(self.alpha_logit).to(q.dtype)[:, None, None]  # (H, 1, 1)
                scores = alpha * scores + (1 - alpha) * dot
        if terms is not None:
            bias = terms.score_bias(q, q_pos[:, None], torch.arange(t_k, device=q.device)[None, :])
            scores = scores if bias is None else scores + bias
        return scores.expand(q.size(0), -1, -1, -1)

    def attend_at(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        q_pos: torch.Tensor,
        mask: torch.Tensor | None,
        terms: PositionTerms | None = None,
        dropout_p: float = 0.0,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """softmax(logits) v over the keys `mask` (bool, broadcastable to `(B, H, Tq, Tk)`) allows,
        for queries at q_pos `(Tq,)`: the whole sequence, or new tokens against a KV cache.
        Returns `(y (B, H, Tq, D), weights (B, H, Tq, Tk))`; a query that sees no key gets zeros."""
        scores = self.logits(q, k, q_pos, terms)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        if mask is not None:
            weights = weights.masked_fill(~mask, 0.0)  # rows with every key hidden: zeros, not NaN
        applied = nn.functional.dropout(weights, dropout_p) if dropout_p > 0.0 else weights
        y = applied @ v
        if terms is not None:
            k_pos = torch.arange(k.size(2), device=q.device)[None, :]
            extra = terms.value_bias(applied, q_pos[:, None], k_pos)
            y = y if extra is None else y + extra
        return y, weights

    def _forward(self, q, k, v, causal, key_padding, terms, dropout_p):
        pos = torch.arange(q.size(2), device=q.device)
        mask = self.key_mask(pos, k.size(2), causal=causal)  # (T, T)
        if key_padding is not None:
            mask = mask & key_padding[:, None, None, :]  # (B, 1, T, T)
        return self.attend_at(q, k, v, pos, mask, terms, dropout_p)[0]


class DenseSynthesizer(Synthesizer):
    """Dense synthesizer (§3.1, Eq. 3): B_i = W₂ ReLU(W₁ q_i + b₁) + b₂ ∈ R^L per head."""

    def __init__(self, n_heads: int, head_dim: int, max_len: int, mix: str = "alone") -> None:
        super().__init__(n_heads, head_dim, max_len, mix)
        d = head_dim
        self.w1, self.b1 = _normal(n_heads, d, d, std=d**-0.5), nn.Parameter(torch.zeros(n_heads, d))
        self.w2, self.b2 = _normal(n_heads, d, max_len, std=d**-0.5), nn.Parameter(torch.zeros(n_heads, max_len))

    def synthesize(self, q, q_pos, t_k):
        h = torch.relu(torch.einsum("bhtd,hde->bhte", q, self.w1.to(q.dtype)) + self.b1[:, None].to(q.dtype))
        return torch.einsum("bhte,hel->bhtl", h, self.w2[..., :t_k].to(q.dtype)) + self.b2[:, None, :t_k]


def _factor_pair(n: int) -> tuple[int, int]:
    """a, b with a · b = n and a the largest divisor of n at most √n: 64 -> (8, 8), 96 -> (8, 12)."""
    a = max(d for d in range(1, math.isqrt(n) + 1) if n % d == 0)
    return a, n // a


class FactorizedDenseSynthesizer(Synthesizer):
    """Factorized dense synthesizer (§3.1): two small dense synthesizers give A ∈ R^a and B ∈ R^b
    with a · b = L (`_factor_pair`), and the logits are their outer product read row by row,
    C[i · b + j] = A[i] · B[j] (the paper's tiling of A and B, multiplied element-wise)."""

    def __init__(self, n_heads: int, head_dim: int, max_len: int, mix: str = "alone") -> None:
        super().__init__(n_heads, head_dim, max_len, mix)
        d = head_dim
        self.a, self.b = _factor_pair(max_len)
        self.w1a, self.b1a = _normal(n_heads, d, d, std=d**-0.5), nn.Parameter(torch.zeros(n_heads, d))
        self.w2a, self.b2a = _normal(n_heads, d, self.a, std=d**-0.5), nn.Parameter(torch.zeros(n_heads, self.a))
        self.w1b, self.b1b = _normal(n_heads, d, d, std=d**-0.5), nn.Parameter(torch.zeros(n_heads, d))
        self.w2b, self.b2b = _normal(n_heads, d, self.b, std=d**-0.5), nn.Parameter(torch.zeros(n_heads, self.b))

    @staticmethod
    def _dense(q, w1, b1, w2, b2):
        h = torch.relu(torch.einsum("bhtd,hde->bhte", q, w1.to(q.dtype)) + b1[:, None].to(q.dtype))
        return torch.einsum("bhte,hel->bhtl", h, w2.to(q.dtype)) + b2[:, None].to(q.dtype)

    def synthesize(self, q, q_pos, t_k):
        a = self._dense(q, self.w1a, self.b1a, self.w2a, self.b2a)  # (B, H, Tq, a)
        b = self._dense(q, self.w1b, self.b1b, self.w2b, self.b2b)  # (B, H, Tq, b)
        return (a[..., :, None] * b[..., None, :]).flatten(-2)[..., :t_k]  # (B, H, Tq, a·b = L) -> Tk


class RandomSynthesizer(Synthesizer):
    """Random synthesizer (§3.2): a learned table R `(H, L, L)`, initialised at random and shared
    by every input; query i's logits are row i of it, B_i = R[i]."""

    def __init__(self, n_heads: int, head_dim: int, max_len: int, mix: str = "alone") -> None:
        super().__init__(n_heads, head_dim, max_len, mix)
        self.table = _normal(n_heads, max_len, max_len, std=max_len**-0.5)

    def synthesize(self, q, q_pos, t_k):
        return self.table[:, q_pos, :t_k][None]  # (1, H, Tq, Tk)


SYNTHESIZERS: dict[str, tuple[type[Synthesizer], str]] = {
    "synthesizer-dense": (DenseSynthesizer, "alone"),
    "synthesizer-dense+": (DenseSynthesizer, "plus"),
    "synthesizer-dense+alpha": (DenseSynthesizer, "alpha"),
    "synthesizer-factorized": (FactorizedDenseSynthesizer, "alone"),
    "synthesizer-random": (RandomSynthesizer, "alone"),
    "synthesizer-random+": (RandomSynthesizer, "plus"),
    "synthesizer-random+alpha": (RandomSynthesizer, "alpha"),
}
"""The attention names of the synthesizers (Narang et al.'s seven rows): class and mix."""


def build_synthesizer(name: str, options: PatternOptions) -> Synthesizer:
    """The synthesizer called `name` (one of `SYNTHESIZERS`), sized by the pattern options."""
    cls, mix = SYNTHESIZERS[name]
    return cls(options.n_heads, options.head_dim, options.max_len, mix)
