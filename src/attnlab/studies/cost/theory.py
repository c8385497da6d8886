"""What theory says of each model's cost (the lectures' table, extended to the attention patterns),
and the exponent of t fitted to measured points (`fit_exponent`)."""

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

QUANTITIES = (
    "train_time",
    "train_memory",
    "generate_time",
    "generate_memory",
    "sequential_steps",
    "max_path_length",
)
COUNTED = ("sequential_steps", "max_path_length")
"""The quantities counted on the dependency graph (`count_steps`) rather than measured."""
QUANTITY_LABELS = {
    "train_time": "training step time",
    "train_memory": "training step memory",
    "generate_time": "generation time",
    "generate_memory": "generation memory",
    "sequential_steps": "sequential steps",
    "max_path_length": "max path length",
}


@dataclass(frozen=True)
class Theory:
    formula: str
    exponent: int | None
    """The exponent of t in the formula, for large t; None where no power of t fits (unbounded)."""
    source: str
    """"lectures" (their table) or "derived" (not in the table; derived here for these models)."""


THEORY: dict[tuple[str, str], Theory] = {
    ("rnn", "train_time"): Theory("t·k²·d", 1, "lectures"),
    ("rnn-attention", "train_time"): Theory("t²·k²·d", 2, "lectures"),
    ("transformer", "train_time"): Theory("t²·k·d", 2, "lectures"),
    ("rnn", "generate_memory"): Theory("k·d", 0, "lectures"),
    ("rnn-attention", "generate_memory"): Theory("t·k·d", 1, "lectures"),
    ("transformer", "generate_memory"): Theory("t·k·d", 1, "lectures"),
    ("rnn", "sequential_steps"): Theory("t", 1, "lectures"),
    ("rnn-attention", "sequential_steps"): Theory("t", 1, "lectures"),
    ("transformer", "sequential_steps"): Theory("d", 0, "lectures"),
    ("rnn", "max_path_length"): Theory("t", 1, "lectures"),
    ("rnn-attention", "max_path_length"): Theory("1", 0, "lectures"),
    ("transformer", "max_path_length"): Theory("1", 0, "lectures"),
    # Not in the lectures' table: t steps of the training work per token, attending over i states.
    ("rnn", "generate_time"): Theory("t·k²·d", 1, "derived"),
    ("rnn-attention", "generate_time"): Theory("t·k²·d + t²·k·d", 2, "derived"),
    ("transformer", "generate_time"): Theory("t·k²·d + t²·k·d", 2, "derived"),
    # Activations kept for backward: additive attention keeps a k-vector per pair (j, i); the
    # fused attention kernel keeps no (t, t) weights (log-sum-exp and output only).
    ("rnn", "train_memory"): Theory("t·k·d", 1, "derived"),
    ("rnn-attention", "train_memory"): Theory("t²·k·d", 2, "derived"),
    ("transformer", "train_memory"): Theory("t·k·d", 1, "derived"),
    # The attention patterns, none of them in the lectures' table. Training runs the pattern's
    # blocked computation: each query scores its w keys (window) or m blocks of b keys (BigBird:
    # m = 2 window blocks + global + random), and the scores and weights, h per pair, are kept for
    # backward beside the t·k·d activations of every model.
    ("transformer-window", "train_time"): Theory("t·w·k·d", 1, "derived"),
    ("transformer-bigbird", "train_time"): Theory("t·m·b·k·d", 1, "derived"),
    ("transformer-window", "train_memory"): Theory("t·(k+h·w)·d", 1, "derived"),
    ("transformer-bigbird", "train_memory"): Theory("t·(k+h·m·b)·d", 1, "derived"),
    # Generation in this implementation: the KV cache keeps every key, and a cached step applies
    # the pattern as a mask over all of it (MultiHeadAttention), so step i still scores i keys:
    # the cost of full attention. A cache trimmed to the window would give t·w·k·d and w·k·d.
    ("transformer-window", "generate_time"): Theory("t·k²·d + t²·k·d", 2, "derived"),
    ("transformer-bigbird", "generate_time"): Theory("t·k²·d + t²·k·d", 2, "derived"),
    ("transformer-window", "generate_memory"): Theory("t·k·d", 1, "derived"),
    ("transformer-bigbird", "generate_memory"): Theory("t·k·d", 1, "derived"),
    # Every position of a sublayer at once, as with full attention (Vaswani et al. Table 1, O(1)).
    ("transformer-window", "sequential_steps"): Theory("d", 0, "derived"),
    ("transformer-bigbird", "sequential_steps"): Theory("d", 0, "derived"),
    # Vaswani et al.'s O(t/w) for restricted attention counts the layers needed to connect t
    # positions; with d layers fixed, a key more than d·(w - 1) positions back is not reached at
    # all. BigBird's 2-hop paths through global tokens hold in the bidirectional model only: a
    # causal global block sees nothing after itself, so paths run through window and random blocks,
    # and some pairs are cut off once t is a few times d·b (`count_steps` counts it on the masks).
    ("transformer-window", "max_path_length"): Theory("∞ past d(w−1)+1", None, "derived"),
    ("transformer-bigbird", "max_path_length"): Theory("∞ for t ≫ d·b", None, "derived"),
}


# -- fitting ----------------------------------------------------------------------------------------
def fit_exponent(lengths: Sequence[int], values: Sequence[float]) -> float | None:
    """The slope of log(value) against log(t) by least squares: value ≈ c·t^slope.
    Example: `([1, 2, 4], [3, 12, 48])` -> 2.0. None when a value is missing or not positive."""
    if len(lengths) != len(values):
        raise ValueError(f"{len(lengths)} lengths but {len(values)} values")
    if len(lengths) < 2:
        raise ValueError("a slope needs at least two points")
    if any(v is None or not v > 0 for v in values):
        return None
    x, y = np.log(np.asarray(lengths, dtype=float)), np.log(np.asarray(values, dtype=float))
    slope, _ = np.polyfit(x, y, 1)
    return float(slope)
