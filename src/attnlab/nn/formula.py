"""The attention weights as Eq. 1 of Vaswani et al. writes them, shared by every path that needs
them written out: `MultiHeadAttention`'s explicit path and the blocked patterns of `attnlab.nn.sparse`."""

import math

import torch


def attention_weights(
    q: torch.Tensor,
    k: torch.Tensor,
    mask: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    *,
    scale: float | None = None,
) -> torch.Tensor:
    """softmax(q kᵀ / √D + bias) over the keys that `mask` lets each query see: `(..., Tq, Tk)`.
    A query whose keys are all masked gets zero weights, never NaN. `bias` (a position scheme's
    term, already scaled) broadcasts to the scores. `scale` replaces 1/√D where given."""
    scores = q @ k.transpose(-2, -1)  # (..., Tq, Tk)
    scores = scores / math.sqrt(q.size(-1)) if scale is None else scores * scale
    if bias is not None:
        scores = scores + bias
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    if mask is not None:
        # A row with every key masked is softmax(-inf, ..., -inf) = NaN; it attends to nothing.
        weights = weights.masked_fill(~mask, 0.0)
    return weights
