"""Product key memory (Lample et al. 2019): a large key-value memory in place of a feed-forward layer.

The memory holds N = n² values, addressed by keys that are the concatenations [c_i; c'_j] of two
sets of n sub-keys (§3.2, Figure 2). A token's query q(x) is split in halves q₁, q₂; the top k
sub-keys of each half (by q₁ · c_i and q₂ · c'_j) give k² candidate keys with scores
q₁ · c_i + q₂ · c'_j, exactly the scores of the full keys; the best k of those are softmaxed and
weight their values: m(x) = Σ_{i ∈ top-k} softmax(s)_i v_i (§3.1, Eq. 2–4). The best k of the k²
candidates are the best k of all N keys (a key outside the k best of either half is beaten by k
keys that are in both), so the search costs O((n + k²) d) for a memory of n² values. Several heads
(§3.3) each have their own query and sub-keys, share the values, and sum their outputs.

Position-wise, like the layer it replaces: it serves causal models and cached decoding alike.
The paper's batch normalization of the query is left out: in a causal model its batch statistics
would mix later positions into earlier queries.

Shape legend: N rows (tokens), C model width, h heads, k the top k, n sub-keys per half.
"""

import torch
from torch import nn


class ProductKeyMemory(nn.Module):
    """m(x) for x `(..., C)` -> `(..., C)`: `n_keys`² values, `top_k` read per head, `heads` heads."""

    def __init__(self, d_model: int, n_keys: int, *, top_k: int = 8, heads: int = 4, dropout: float = 0.0) -> None:
        super().__init__()
        if d_model < 2:
            raise ValueError(f"a product key memory splits the query in halves: the width must be >= 2, got {d_model}")
        if not 1 <= top_k <= n_keys:
            raise ValueError(f"memory_top_k must be between 1 and memory_keys ({n_keys}), got {top_k}")
        if heads < 1:
            raise ValueError(f"memory_heads must be >= 1, got {heads}")
        self.n_keys, self.top_k, self.heads, self.half = n_keys, top_k, heads, d_model // 2
        self.query = nn.Linear(d_model, heads * 2 * self.half)
        # The authors' initialisation (facebookresearch/XLM, memory.py): uniform sub-keys at the
        # scale of a unit query half, values N(0, 1/C).
        bound = self.half**-0.5
        self.sub_keys = nn.Parameter(torch.empty(heads, 2, n_keys, self.half).uniform_(-bound, bound))
        self.values = nn.EmbeddingBag(n_keys * n_keys, d_model, mode="sum")
        nn.init.normal_(self.values.weight, mean=0.0, std=d_model**-0.5)
        self.dropout = nn.Dropout(dropout)

    def extra_repr(self) -> str:
        return f"keys={self.n_keys}², top_k={self.top_k}, heads={self.heads}"

    def lookup(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The k best keys of each head for x `(N, C)`: scores `(N, h, k)`, best first, and the
        values' indices `(N, h, k)` long, i · n + j for the key [c_i; c'_j]."""
        q = self.query(x).view(x.size(0), self.heads, 2, self.half)  # (N, h, 2, C/2)
        halves = torch.einsum("nhsd,hsmd->nhsm", q, self.sub_keys.to(q.dtype))  # (N, h, 2, n)
        s1, i1 = halves[:, :, 0].topk(self.top_k, dim=-1)  # (N, h, k)
        s2, i2 = halves[:, :, 1].topk(self.top_k, dim=-1)
        candidates = (s1[..., :, None] + s2[..., None, :]).flatten(-2)  # (N, h, k²)
        index = (i1[..., :, None] * self.n_keys + i2[..., None, :]).flatten(-2)
        scores, best = candidates.topk(self.top_k, dim=-1)  # (N, h, k)
        return scores, index.gather(-1, best)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])  # (N, C)
        scores, index = self.lookup(flat)
        weights = torch.softmax(scores.float(), dim=-1).to(self.values.weight.dtype)  # (N, h, k)
        # One bag per token: its h · k values, weighted, summed (the heads' outputs added, §3.3).
        out = self.values(index.flatten(1), per_sample_weights=weights.flatten(1))  # (N, C)
        return self.dropout(out.to(x.dtype)).view(shape)
