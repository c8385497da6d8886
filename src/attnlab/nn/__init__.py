"""Building blocks shared by every model: attention, masks, positions, feed-forward, blocks."""

from attnlab.nn.attention import KVCache, MultiHeadAttention, scaled_dot_product_attention
from attnlab.nn.blocks import NORM_ORDERS, DecoderBlock, TransformerBlock
from attnlab.nn.feedforward import ACTIVATIONS, FeedForward
from attnlab.nn.init import normal_init
from attnlab.nn.masks import causal_mask, padding_mask, padding_mask_from_ids
from attnlab.nn.positions import (
    ATTENTION_POSITIONS,
    INPUT_POSITIONS,
    POSITIONS,
    ALiBiPositions,
    AttentionPositions,
    FourierPositions,
    InputPositions,
    LearnedPositions,
    NoPositions,
    RelativePositions,
    RotaryPositions,
    SinusoidalPositions,
    alibi_slopes,
    build_attention_positions,
    build_positions,
    embedding_scale,
    fourier_positions,
    fourier_shift,
    rope_angles,
    rope_rotate,
    sinusoidal_positions,
)
from attnlab.nn.projection import Linear, linear
from attnlab.nn.variants import PATTERN_NAMES, AttentionOptions, AttentionSpec, context_limit

__all__ = [
    "ACTIVATIONS",
    "ATTENTION_POSITIONS",
    "INPUT_POSITIONS",
    "NORM_ORDERS",
    "PATTERN_NAMES",
    "POSITIONS",
    "ALiBiPositions",
    "AttentionOptions",
    "AttentionPositions",
    "AttentionSpec",
    "FourierPositions",
    "InputPositions",
    "RelativePositions",
    "RotaryPositions",
    "alibi_slopes",
    "build_attention_positions",
    "context_limit",
    "fourier_positions",
    "fourier_shift",
    "rope_angles",
    "rope_rotate",
    "DecoderBlock",
    "FeedForward",
    "KVCache",
    "LearnedPositions",
    "Linear",
    "MultiHeadAttention",
    "NoPositions",
    "SinusoidalPositions",
    "TransformerBlock",
    "build_positions",
    "causal_mask",
    "embedding_scale",
    "linear",
    "normal_init",
    "padding_mask",
    "padding_mask_from_ids",
    "scaled_dot_product_attention",
    "sinusoidal_positions",
]
