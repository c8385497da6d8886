"""The Funnel Transformer (Dai et al. 2020): an encoder whose sequence shrinks between stages.

The blocks are grouped into stages (`funnel_stages = [2, 2]`: two stages of two blocks). Between
two stages the hidden sequence is mean-pooled with stride 2 (§2.2, "stride 2 and window size 2").
Only the queries of the next stage's first block are pooled ("pool-query-only", Eq. 2): its
attention reads the unpooled keys and values, so the pooled position h'_i = Attn(pool(h)_i, h, h)
still sees every token; its residual is the pooled sequence; the blocks after it run on the
shortened sequence. A model that needs an output per input position (masked-LM, tagging) up-samples
the last stage's output by repeating each vector 2^(S−1) times, adds the first stage's output (the
full-length residual) and runs a few full-length blocks, the "decoder" of §2.2; a classifier reads
the short sequence alone.

Padding: a pooled position is the mean of the real (not padding) tokens of its pair, and is
padding only when both are. Dai et al.'s code pools the mask with a minimum instead (a pair with
one pad token becomes padding), which drops the last real token of every odd-length sentence; the
mean over real tokens keeps it and needs no pad-token value. An odd length gets one pad position
before pooling. The paper also keeps [CLS] out of the pooling ("separate [cls]"); attnlab does not:
pooling "mean" reads the whole short sequence, and pooling "cls" the first pair's mean.

A causal model cannot pool over time: a pooled position holds the later token of its pair, so the
earlier one's query would see its future.

Shape legend: B batch, T time, C model dim.

References:
- Dai, Lai, Yang, Le 2020, "Funnel-Transformer: Filtering out Sequential Redundancy for Efficient
  Language Processing", §2.2.
- Narang et al. 2021, "Do Transformer Modifications Transfer Across Implementations and
  Applications?", Table 1's "Funnel Transformer" row.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F


def pool_pairs(x: torch.Tensor, real: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean-pool x with window and stride 2 over time, over the real positions of each pair.

    x `(B, T, C)`, real bool `(B, T)` (False on padding) -> pooled `(B, ⌈T/2⌉, C)` and its real
    mask `(B, ⌈T/2⌉)`: a pair's mean over its real members; padding where neither is real (its
    vector is then 0). Example: rows [a, b, c] all real -> [(a + b) / 2, c]; [a, pad] -> [a].
    """
    b, t, c = x.shape
    if t % 2:  # an odd length: one pad position closes the last pair
        x = F.pad(x, (0, 0, 0, 1))
        real = F.pad(real, (0, 1), value=False)
    weight = real.view(b, -1, 2).to(x.dtype)  # (B, T/2, 2)
    total = (x.view(b, -1, 2, c) * weight.unsqueeze(-1)).sum(2)  # (B, T/2, C)
    count = weight.sum(2, keepdim=True)  # (B, T/2, 1)
    return total / count.clamp(min=1), count.squeeze(-1) > 0


def pool_mask(real: torch.Tensor, times: int) -> torch.Tensor:
    """The real mask `(B, T)` after `times` poolings of `pool_pairs`: `(B, ⌈T/2^times⌉)`."""
    for _ in range(times):
        if real.size(1) % 2:
            real = F.pad(real, (0, 1), value=False)
        real = real.view(real.size(0), -1, 2).any(-1)
    return real


def upsample(x: torch.Tensor, times: int, length: int) -> torch.Tensor:
    """§2.2's up-sampling: each position of x `(B, T', C)` repeated 2^times times, cut to
    `length`: `(B, length, C)`. Position i of the result holds pooled position ⌊i / 2^times⌋, the
    one that pooled it."""
    return x.repeat_interleave(2**times, dim=1)[:, :length]


@dataclass(frozen=True)
class FunnelOptions:
    """The Funnel Transformer's config field, a mixin for the model families; only a
    bidirectional encoder (BERT, the encoder–decoder's encoder) accepts it (`check_funnel`)."""

    funnel_stages: tuple[int, ...] | None = None
    """Blocks per stage of a Funnel Transformer (Dai et al. 2020), e.g. [2, 2]: the sequence is
    mean-pooled with stride 2 between stages (the first block of each later stage pools its queries
    only); the counts sum to n_layers (an encoder–decoder's n_encoder_layers). None: no pooling."""

    def check_funnel(self, n_layers: int, *, causal: bool, layers_field: str = "n_layers") -> None:
        """ValueError when `funnel_stages` is malformed, or set on a causal model; `layers_field`
        names the count the stages must sum to (an encoder–decoder's "n_encoder_layers")."""
        stages = self.funnel_stages
        if stages is None:
            return
        if causal:
            raise ValueError(
                "funnel_stages pools pairs of positions over time, and a pooled position holds the later token "
                "of its pair: a causal model would see its future; the Funnel Transformer is for an encoder (BERT, "
                "an encoder–decoder's encoder)"
            )
        if len(stages) < 2 or min(stages) < 1 or sum(stages) != n_layers:
            raise ValueError(
                f"funnel_stages must list two or more stages of >= 1 block each, summing to {layers_field} "
                f"({n_layers}), got {list(stages)}"
            )

    def funnel_pool_layers(self) -> frozenset[int]:
        """The layers whose queries are pooled: the first of every stage but the first."""
        starts, at = set(), 0
        for count in (self.funnel_stages or ())[:-1]:
            at += count
            starts.add(at)
        return frozenset(starts)
