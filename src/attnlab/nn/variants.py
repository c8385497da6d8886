"""Which position scheme and which attention pattern a model's self-attention uses, by name.

A model config names them (`model.positions`, `model.attention`) beside their few settings; the
config mixin `AttentionOptions` holds those fields once for every family and turns them into an
`AttentionSpec`, the one object the blocks hand down to `MultiHeadAttention`, which builds its
own parts from it. Adding a scheme or a pattern adds a class to a registry, not a flag to every
constructor.
"""

import dataclasses
from dataclasses import dataclass

from torch import nn

from attnlab.nn.conv_attention import CONVOLUTIONS
from attnlab.nn.positions import (
    AttentionPositions,
    build_attention_positions,
    check_choice,
    check_positions,
)
from attnlab.nn.sparse import PATTERNS, PatternOptions, build_pattern
from attnlab.nn.synthesizer import SYNTHESIZERS, build_synthesizer

PATTERN_NAMES = (*PATTERNS, *SYNTHESIZERS, *CONVOLUTIONS)
"""Attention patterns (`attnlab.nn.sparse`): which keys each query sees; the synthesizers
(`attnlab.nn.synthesizer`), whose logits are learned rather than dot products; and the
convolutions (`attnlab.nn.conv_attention`), which replace the attention (`BlockParts`)."""

FIXED_LENGTH = ("linformer", *SYNTHESIZERS)
"""Patterns with parameters for each of `max_len` positions: no sequence may be longer."""


@dataclass(frozen=True)
class AttentionSpec:
    """How one stack's self-attention places tokens and which keys it reads. Built by
    `AttentionOptions.attention_spec`; `MultiHeadAttention(..., spec=...)` builds its parts."""

    positions: str = "none"
    pattern: str = "full"
    max_len: int = 512
    rope_theta: float = 10000.0
    relative_distance: int = 16
    window: int = 128
    block: int = 64
    global_blocks: int = 1
    random_blocks: int = 1
    linformer_k: int = 64
    conv_kernel: int = 15
    seed: int = 0
    """BigBird's random blocks: each layer gets its own (`for_layer`)."""

    def for_layer(self, index: int) -> "AttentionSpec":
        return dataclasses.replace(self, seed=self.seed + index)

    def build_positions(self, n_heads: int, head_dim: int) -> AttentionPositions | None:
        return build_attention_positions(
            self.positions, n_heads, head_dim, theta=self.rope_theta, max_distance=self.relative_distance
        )

    def build_pattern(self, n_heads: int, head_dim: int) -> nn.Module | None:
        """The pattern module, or None for full attention (MultiHeadAttention's own paths)."""
        if self.pattern == "full":
            return None
        if self.pattern in CONVOLUTIONS:  # built by BlockParts.build_attention, never as a pattern
            raise ValueError(f"attention {self.pattern!r} is a convolution: it replaces a block's self-attention")
        if self.pattern in SYNTHESIZERS:
            options = PatternOptions(n_heads, head_dim, self.max_len, 0, 0, 0, 0, 0, self.seed)
            return build_synthesizer(self.pattern, options)
        return build_pattern(
            self.pattern,
            n_heads=n_heads,
            head_dim=head_dim,
            max_len=self.max_len,
            window=self.window,
            block=self.block,
            global_blocks=self.global_blocks,
            random_blocks=self.random_blocks,
            linformer_k=self.linformer_k,
            seed=self.seed,
        )


@dataclass(frozen=True)
class AttentionOptions:
    """Config fields of the attention variants, shared by the GPT, BERT and encoder–decoder
    configs (a mixin: each family's config inherits them; `positions` is the family's own)."""

    attention: str = "full"
    """Which keys each query sees: "full", "window" (the last `attention_window` keys; both ways in
    an encoder), "bigbird" (blocks: window + global + random, Zaheer et al. 2020) or "linformer"
    (keys and values projected along the sequence to `linformer_k` rows; encoders only); or one of
    the synthesizers (Tay et al. 2021): "synthesizer-dense", "synthesizer-dense+",
    "synthesizer-dense+alpha", "synthesizer-factorized", "synthesizer-random",
    "synthesizer-random+", "synthesizer-random+alpha" (`attnlab.nn.synthesizer`); or a convolution
    in place of self-attention (Wu et al. 2019): "lightweight-conv", "dynamic-conv"
    (`attnlab.nn.conv_attention`; GPT and BERT)."""
    attention_window: int = 128
    """Window width w of "window" attention: a query sees w keys back (and w − 1 ahead in an encoder)."""
    attention_block: int = 64
    """Block size of "bigbird" attention."""
    global_blocks: int = 1
    """BigBird: how many leading blocks are global (attend to and are attended by every position)."""
    random_blocks: int = 1
    """BigBird: random key blocks per query block."""
    linformer_k: int = 64
    """Linformer: the rows k that keys and values are projected to."""
    rope_theta: float = 10000.0
    """RoPE's base: pair i of a head turns at theta^(−2i/D) radians a position."""
    relative_distance: int = 16
    """Shaw et al.'s clipping distance k: offsets beyond ±k share a vector."""
    conv_kernel: int = 15
    """Taps k of "lightweight-conv" and "dynamic-conv": a causal model reads the last k positions.
    15 is the middle of Wu et al.'s schedule (3 … 31 by layer), a quarter of a 64-character context."""

    def check_attention(self, positions: str, *, causal: bool, head_dim: int, d_model: int) -> None:
        """ValueError naming the field for a combination that cannot run."""
        check_positions(positions)
        check_choice("attention", self.attention, PATTERN_NAMES)
        for name in ("attention_window", "attention_block", "linformer_k", "relative_distance", "conv_kernel"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("global_blocks", "random_blocks"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.rope_theta <= 0:
            raise ValueError(f"rope_theta must be > 0, got {self.rope_theta}")
        if positions == "rope" and head_dim % 2:
            raise ValueError(f"positions 'rope' rotates pairs: the head size must be even, got {head_dim}")
        if positions == "fourier" and d_model % 2:
            raise ValueError(f"positions 'fourier' comes in (cos, sin) pairs: the width must be even, got {d_model}")
        if self.attention in CONVOLUTIONS and positions in ("rope", "alibi", "relative"):
            raise ValueError(
                f"attention {self.attention!r} is a convolution: it has no keys for {positions!r} positions to "
                "act on; use learned, sinusoidal or none"
            )
        if self.attention == "linformer":
            if causal:
                raise ValueError(
                    "attention 'linformer' mixes every position into k rows, so a causal model (GPT, the "
                    "decoder) would see the future; use 'window' or 'bigbird', or linformer in BERT"
                )
            if positions in ("alibi", "relative"):
                raise ValueError(
                    f"attention 'linformer' projects the keys along the sequence, so they have no positions "
                    f"for {positions!r} to compare; use rope or a scheme at the input"
                )

    def attention_spec(self, positions: str, max_len: int) -> AttentionSpec:
        return AttentionSpec(
            positions=positions,
            pattern=self.attention,
            max_len=max_len,
            rope_theta=self.rope_theta,
            relative_distance=self.relative_distance,
            window=self.attention_window,
            block=self.attention_block,
            global_blocks=self.global_blocks,
            random_blocks=self.random_blocks,
            linformer_k=self.linformer_k,
            conv_kernel=self.conv_kernel,
        )


def context_limit(max_positions: int | None, attention: str, length: int) -> int | None:
    """The longest sequence a model can read: its configured `length` where the input positions
    are a table (`max_positions`, learned) or Linformer's projections or a synthesizer's logits
    are; None (any length) where every position's encoding is computed (sinusoidal, fourier, none,
    and the schemes inside attention) — those models can be evaluated past their training length."""
    fixed = max_positions is not None or attention in FIXED_LENGTH
    return length if fixed else None
