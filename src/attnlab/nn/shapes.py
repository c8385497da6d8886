"""Narang et al. 2021's depth–width trade-offs, scaled to any base model at equal parameters.

The paper's baseline (T5-base) has 12 layers, d_ff 3072 and 12 heads; its four rows trade depth
for width at the same parameter count: 24 layers d_ff 1536 H 6; 18 layers d_ff 2048 H 8; 8 layers
d_ff 4608 H 18; 6 layers d_ff 6144 H 24. T5's attention is H heads of 64, so its size follows H;
attnlab's attention is as wide as the model whatever H, so here the feed-forward width alone
absorbs the change of depth: d_ff is solved so that the blocks hold the base's parameters.

A block of width C and hidden width F, with biases and two LayerNorms, holds
4C² + 4C (attention) + 2CF + F + C (feed-forward) + 4C (norms) parameters; without biases,
4C² + 2CF + 2C.
"""

import math
from dataclasses import dataclass

PAPER_BASELINE = (12, 3072, 12)
"""T5-base: layers, d_ff, heads."""

PAPER_SHAPES = {"24l": (24, 1536, 6), "18l": (18, 2048, 8), "8l": (8, 4608, 18), "6l": (6, 6144, 24)}
"""The table's four rows: layers, d_ff, heads."""


@dataclass(frozen=True)
class Shape:
    """One depth–width row at the base's size."""

    n_layers: int
    n_heads: int
    ffn_hidden: int


def block_parameters(d_model: int, d_ff: int, *, bias: bool = True) -> int:
    """The parameters of one dense pre- or post-norm block: `(96, 384, bias=True)` -> 111,648."""
    if bias:
        return 4 * d_model**2 + 4 * d_model + 2 * d_model * d_ff + d_ff + d_model + 4 * d_model
    return 4 * d_model**2 + 2 * d_model * d_ff + 2 * d_model


def _layers(base_layers: int, ratio: float) -> int:
    """The base's depth times the table's ratio; a deeper row rounds up and a shallower one down,
    so that the four rows stay four distinct depths at a small base (3 layers: 6, 5, 2, 1)."""
    exact = base_layers * ratio
    return max(1, math.ceil(exact) if ratio > 1 else math.floor(exact))


def _heads(base_heads: int, ratio: float, d_model: int) -> int:
    """The divisor of d_model nearest the base's heads times the ratio (ties: the table's direction)."""
    want = base_heads * ratio
    divisors = [h for h in range(1, d_model + 1) if d_model % h == 0]
    return min(divisors, key=lambda h: (abs(h - want), -h if ratio > 1 else h))


def depth_width_shapes(n_layers: int, d_model: int, n_heads: int, d_ff: int, *, bias: bool = True) -> dict[str, Shape]:
    """The table's four rows for a base of `n_layers` blocks of width `d_model`, `n_heads` heads and
    hidden width `d_ff`: each row's depth and heads scaled by the table's ratios to T5-base, its
    hidden width solved for the base's block parameters (embeddings are the same in every row).
    Example: `(3, 96, 3, 384, bias=False)` -> {"24l": Shape(6, 1, 96), "18l": Shape(5, 2, 153), ...} (no biases)."""
    base_layers, _, base_heads = PAPER_BASELINE
    total = n_layers * block_parameters(d_model, d_ff, bias=bias)
    fixed = block_parameters(d_model, 0, bias=bias)  # a block's parameters that do not grow with F
    per_hidden = 2 * d_model + (1 if bias else 0)
    shapes = {}
    for name, (layers, _, heads) in PAPER_SHAPES.items():
        depth = _layers(n_layers, layers / base_layers)
        hidden = round((total / depth - fixed) / per_hidden)
        if hidden < 1:
            raise ValueError(
                f"at {depth} layers the base's {total} block parameters leave no room for a feed-forward "
                "layer; use a base with a wider feed-forward layer"
            )
        shapes[name] = Shape(depth, _heads(n_heads, heads / base_heads, d_model), hidden)
    return shapes
