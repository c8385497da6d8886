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
    ATTENTION_POSITIONS,
    ROPE_SCALINGS,
    AttentionPositions,
    RopeScaling,
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

INSIDE_ATTENTION = tuple(ATTENTION_POSITIONS)
"""The position schemes that act on the keys (`attnlab.nn.positions.ATTENTION_POSITIONS`): a
convolution in place of attention has none for them to act on."""
ON_THE_SCORES = tuple(
    name for name, cls in ATTENTION_POSITIONS.items() if cls.score_bias is not AttentionPositions.score_bias
)
"""The schemes that add a term to each score by its key's offset (those with a `score_bias` of their
own): Linformer's keys, projected along the sequence, have no offsets for them."""

QK_NORMS = ("none", "rmsnorm", "offset-rmsnorm")
"""The norms over each head's queries and keys (`AttentionOptions.qk_norm`)."""


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
    rope_scaling: RopeScaling = RopeScaling()
    rotary_dims: int | None = None
    """The dimensions of each head that RoPE rotates (the first ones); None: all."""
    head_size: int | None = None
    """Each head's size D where it is not d_model / n_heads (Qwen3, Gemma 3)."""
    qkv_bias: bool | None = None
    """Biases on the q, k, v projections alone (Qwen2); None: as the block's `bias`."""
    qk_norm: str = "none"
    """A norm over each head's queries and keys before positions are applied (Qwen3, Gemma 3)."""
    qk_norm_eps: float = 1e-6
    scale: float | None = None
    """The scores' factor where it is not 1/√D (Gemma's query_pre_attn_scalar^−1/2)."""
    layer_patterns: tuple[str, ...] = ()
    """Each layer's pattern where they differ ("full" or "window"): `for_layer` picks one."""
    window_rope_theta: float | None = None
    """RoPE's base in the window layers where it differs from the full ones' (Gemma 3, ModernBERT)."""
    nope_layers: tuple[int, ...] = ()
    """Layers whose attention has no positions at all (SmolLM3's NoPE layers)."""

    def for_layer(self, index: int) -> "AttentionSpec":
        """Layer `index`'s own spec: its pattern, its RoPE base and positions, its random seed."""
        pattern = self.layer_patterns[index] if self.layer_patterns else self.pattern
        local = pattern == "window" and self.window_rope_theta is not None
        # A window layer with a base of its own keeps its rotary frequencies unscaled (Gemma 3's
        # local layers): the scaling stretches the full layers' long range.
        theta = self.window_rope_theta if local else self.rope_theta
        scaling = RopeScaling() if local else self.rope_scaling
        positions = "none" if index in self.nope_layers else self.positions
        return dataclasses.replace(
            self,
            seed=self.seed + index,
            pattern=pattern,
            rope_theta=theta,
            rope_scaling=scaling,
            positions=positions,
            layer_patterns=(),
        )

    def build_positions(self, n_heads: int, head_dim: int) -> AttentionPositions | None:
        return build_attention_positions(
            self.positions,
            n_heads,
            head_dim,
            theta=self.rope_theta,
            max_distance=self.relative_distance,
            scaling=self.rope_scaling,
            rotary_dims=self.rotary_dims,
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
    # The parts of today's published checkpoints (attnlab.models.hf), none of them on by default.
    rope_scaling: str = "none"
    """How RoPE's frequencies are stretched for long contexts, one of attnlab.nn.positions.ROPE_SCALINGS."""
    rope_factor: float = 1.0
    """rope_scaling's factor: the context's stretch."""
    rope_original_context: int = 8192
    """rope_scaling llama3, longrope, yarn, dynamic: the pre-training context."""
    rope_low_freq_factor: float = 1.0
    """rope_scaling llama3: wavelengths above rope_original_context / this are fully scaled."""
    rope_high_freq_factor: float = 4.0
    """rope_scaling llama3: wavelengths below rope_original_context / this are kept."""
    rope_short_factor: tuple[float, ...] = ()
    """rope_scaling longrope: each rotated pair's divisor within rope_original_context."""
    rope_long_factor: tuple[float, ...] = ()
    """rope_scaling longrope: each rotated pair's divisor past rope_original_context; factors: at every length."""
    rope_attention_factor: float = 1.0
    """rope_scaling longrope, yarn: the factor of the rotations' cosines and sines (YaRN's
    importers set 0.1·ln(rope_factor) + 1, the paper's)."""
    rope_beta_fast: float = 32.0
    """rope_scaling yarn: pairs turning more than this many times over rope_original_context are kept."""
    rope_beta_slow: float = 1.0
    """rope_scaling yarn: pairs turning fewer than this many times over rope_original_context are fully scaled."""
    rotary_dims: int | None = None
    """RoPE rotates the first rotary_dims dimensions of each head and passes the rest (Phi's
    partial rotary); None: the whole head."""
    head_size: int | None = None
    """Each attention head's size; None: the width / the number of heads (Qwen3 and Gemma 3 set it apart)."""
    qkv_bias: bool | None = None
    """Biases on the query, key and value projections alone (Qwen2); None: as the model's `bias`."""
    qk_norm: str = "none"
    """A norm over each head's queries and keys before positions act, one of attnlab.nn.NORMALIZATIONS'
    plain norms or "none" (Qwen3, Gemma 3: RMSNorm)."""
    attention_scale: float | None = None
    """The factor of the scores q·k; None: 1/√(head size) (Gemma: query_pre_attn_scalar^−1/2)."""
    layer_attention: tuple[str, ...] = ()
    """Each layer's pattern, "full" or "window" (Gemma 3's and ModernBERT's interleaved window
    layers); empty: `attention` in every layer."""
    window_rope_theta: float | None = None
    """RoPE's base in the "window" layers of `layer_attention`; None: rope_theta."""
    nope_layers: tuple[int, ...] = ()
    """Layers with no positions at all (SmolLM3's NoPE layers), counted from 0."""

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
        self.check_checkpoint_parts()
        rotated = self.rotary_dims or head_dim
        if positions == "rope" and (rotated % 2 or rotated > head_dim):
            raise ValueError(
                f"positions 'rope' rotates pairs: the rotated size (rotary_dims or the head size {head_dim}) must be "
                f"even and at most the head size, got {rotated}"
            )
        if positions == "fourier" and d_model % 2:
            raise ValueError(f"positions 'fourier' comes in (cos, sin) pairs: the width must be even, got {d_model}")
        if self.attention in CONVOLUTIONS and positions in INSIDE_ATTENTION:
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
            if positions in ON_THE_SCORES:
                raise ValueError(
                    f"attention 'linformer' projects the keys along the sequence, so they have no positions "
                    f"for {positions!r} to compare; use rope or a scheme at the input"
                )

    def check_checkpoint_parts(self) -> None:
        """ValueError naming the field of the published checkpoints' parts that cannot be built."""
        check_choice("rope_scaling", self.rope_scaling, ROPE_SCALINGS)
        check_choice("qk_norm", self.qk_norm, QK_NORMS)
        if self.head_size is not None and self.head_size < 1:
            raise ValueError(f"head_size must be >= 1, got {self.head_size}")
        if self.attention_scale is not None and self.attention_scale <= 0:
            raise ValueError(f"attention_scale must be > 0, got {self.attention_scale}")
        for pattern in self.layer_attention:
            check_choice("layer_attention", pattern, ("full", "window"))
        if self.layer_attention and self.attention != "full":
            raise ValueError("layer_attention sets each layer's pattern: leave attention 'full'")
        if self.window_rope_theta is not None and self.window_rope_theta <= 0:
            raise ValueError(f"window_rope_theta must be > 0, got {self.window_rope_theta}")
        if any(i < 0 for i in self.nope_layers):
            raise ValueError(f"nope_layers counts layers from 0, got {list(self.nope_layers)}")
        self.rope_scaling_spec()  # its own checks

    def check_layers(self, n_layers: int) -> None:
        """ValueError where a per-layer field does not fit `n_layers` layers."""
        if self.layer_attention and len(self.layer_attention) != n_layers:
            raise ValueError(f"layer_attention names {len(self.layer_attention)} layers; the model has {n_layers}")
        if any(i >= n_layers for i in self.nope_layers):
            raise ValueError(f"nope_layers {list(self.nope_layers)} counts past the model's {n_layers} layers")

    def rope_scaling_spec(self) -> RopeScaling:
        return RopeScaling(
            self.rope_scaling,
            self.rope_factor,
            self.rope_original_context,
            self.rope_low_freq_factor,
            self.rope_high_freq_factor,
            self.rope_short_factor,
            self.rope_long_factor,
            self.rope_attention_factor,
            self.rope_beta_fast,
            self.rope_beta_slow,
        )

    def attention_spec(self, positions: str, max_len: int, *, norm_eps: float = 1e-6) -> AttentionSpec:
        """The spec every layer's attention is built from (`AttentionSpec.for_layer` makes each
        layer's own); `norm_eps` is the q/k norm's epsilon, the model's."""
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
            rope_scaling=self.rope_scaling_spec(),
            rotary_dims=self.rotary_dims,
            head_size=self.head_size,
            qkv_bias=self.qkv_bias,
            qk_norm=self.qk_norm,
            scale=self.attention_scale,
            layer_patterns=self.layer_attention,
            window_rope_theta=self.window_rope_theta,
            nope_layers=self.nope_layers,
            qk_norm_eps=norm_eps,
        )


def context_limit(max_positions: int | None, attention: str, length: int) -> int | None:
    """The longest sequence a model can read: its configured `length` where the input positions
    are a table (`max_positions`, learned) or Linformer's projections or a synthesizer's logits
    are; None (any length) where every position's encoding is computed (sinusoidal, fourier, none,
    and the schemes inside attention) — those models can be evaluated past their training length."""
    fixed = max_positions is not None or attention in FIXED_LENGTH
    return length if fixed else None
