"""Sequential steps and maximum path length, counted on each architecture's dependency graph
(Vaswani et al. 2017, Table 1)."""

import dataclasses
import math
from collections.abc import Sequence

import numpy as np
import torch

from attnlab.studies.cost.models import build_model
from attnlab.studies.cost.settings import CostSettings

SUBLAYERS = {
    "rnn": ("recurrent",),
    "rnn-attention": ("recurrent", "attention"),
    "transformer": ("attention",),
    "transformer-window": ("window",),
    "transformer-bigbird": ("bigbird",),
}
"""What one layer of each model is, as dependencies between positions: "recurrent" (position i
needs the layer below at i and itself at i - 1), "attention" (position i needs the layer below
at every j <= i), "window" (at i - w < j <= i, w = `CostSettings.attention_window`) or "bigbird"
(at the keys its layer's `BigBirdAttention.key_mask` lets it see). Position-wise parts
(feed-forward, the attention combination, the head) add no dependency between positions and
count as part of their sublayer."""


def count_steps(model: str, t: int, layers: int, settings: CostSettings | None = None) -> tuple[int, int | None]:
    """(sequential steps, maximum path length) of one forward of `model` over t positions, counted
    on its dependency graph: node (sublayer s, position i) for every sublayer of `layers` layers.
    `settings` gives the attention patterns' sizes (default `CostSettings()`; its `layers` give
    way to `layers`).

    Sequential steps: the nodes on the longest dependency chain, the number of rounds one forward
    needs however many processors run it. Maximum path length: the fewest edges from an input
    position j to an output position i >= j, the longest over all such pairs; None when a pair is
    not connected at all (a window of w keys reaches d·(w - 1) positions back through d layers, no
    further). Example: `("rnn", t=8, layers=2)` -> (9, 9); `("transformer", 8, 2)` -> (2, 2);
    `("transformer-window", 8, 2)` with w = 3 -> (2, None), with w = 5 -> (2, 2).
    """
    settings = settings or CostSettings()
    if SUBLAYERS[model] == ("bigbird",):
        # Random blocks, different in every layer: no rule by distance, so the model's own masks.
        return count_on_key_masks(_key_masks(model, t, layers, settings))
    positions = np.arange(t)
    depth = np.zeros(t)  # longest chain ending at each position of the current sublayer
    # Every position has the same edges (but for those a window loses before position 0, which no
    # path from a later position needs), and edges never point back in time, so the fewest edges
    # from j to i depend on i - j alone: distances from position 0 cover every pair.
    distance = np.full(t, np.inf)
    distance[0] = 0.0
    for _ in range(layers):
        for sublayer in SUBLAYERS[model]:
            if sublayer == "recurrent":
                # x(i) = 1 + max(below(i), x(i - 1))  =>  i + 1 + max_{j <= i} (below(j) - j); same with min.
                depth = positions + 1 + np.maximum.accumulate(depth - positions)
                distance = positions + 1 + np.minimum.accumulate(distance - positions)
            elif sublayer in ("attention", "window"):
                width = t if sublayer == "attention" else settings.attention_window
                depth = 1 + _running(np.maximum, depth, width)
                distance = 1 + _running(np.minimum, distance, width)
            else:
                raise ValueError(f"unknown sublayer {sublayer!r}")
    longest = distance.max()
    return int(depth.max()), None if np.isinf(longest) else int(longest)


def _running(op: np.ufunc, x: np.ndarray, width: int) -> np.ndarray:
    """op (np.maximum or np.minimum) over the last `width` entries of x up to each index, itself
    included. Example: `(np.maximum, [3, 1, 2, 0], 2)` -> [3, 3, 2, 2]."""
    if width >= x.size:
        return op.accumulate(x)
    # Padded in front with copies of x[0], which every window that reaches them already holds.
    padded = np.pad(x, (width - 1, 0), mode="edge")
    return op.reduce(np.lib.stride_tricks.sliding_window_view(padded, width), axis=1)


def count_on_key_masks(masks: Sequence[torch.Tensor]) -> tuple[int, int | None]:
    """`count_steps` for a stack of attention sublayers given by their key masks, bool `(t, t)`
    each, True where query i sees key j of the sublayer below. Every edge joins a sublayer to the
    one below, so every path from an input to an output has one edge per sublayer: what is left to
    count is which pairs connect, from the product of the masks (O(t³) arithmetic: seconds at t = 4096).
    Example: two layers of `[[1, 0, 0], [1, 1, 0], [0, 1, 1]]` -> (2, 2); one -> (1, None)."""
    t = masks[0].size(0)
    depth = torch.zeros(t)
    for mask in masks:
        depth = 1 + torch.where(mask, depth, -math.inf).amax(dim=1)  # (t,): over the keys each query sees
    reach = masks[0].float()  # (outputs, inputs): connected
    for mask in masks[1:]:
        reach = (mask.float() @ reach > 0).float()
    pairs = torch.ones(t, t, dtype=torch.bool).tril()  # j <= i
    connected = bool(reach.bool()[pairs].all())
    return int(depth.max()), len(masks) if connected else None


def _key_masks(model: str, t: int, layers: int, settings: CostSettings) -> list[torch.Tensor]:
    """The key mask `(t, t)` of each layer of `model` over t positions, read from the model's own
    attention patterns (`AttentionPattern.key_mask`), so that the count follows what it computes."""
    gpt = build_model(model, dataclasses.replace(settings, layers=layers), max_len=t)
    positions = torch.arange(t)
    return [block.attn.pattern.key_mask(positions, t, causal=True) for block in gpt.blocks]
