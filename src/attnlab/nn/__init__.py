"""Building blocks shared by every model: attention, masks, positions, feed-forward, blocks."""

from attnlab.nn.attention import KVCache, MultiHeadAttention, scaled_dot_product_attention
from attnlab.nn.blocks import NORM_ORDERS, DecoderBlock, TransformerBlock
from attnlab.nn.feedforward import ACTIVATIONS, FeedForward
from attnlab.nn.init import normal_init
from attnlab.nn.masks import causal_mask, padding_mask, padding_mask_from_ids
from attnlab.nn.positions import (
    POSITIONS,
    LearnedPositions,
    NoPositions,
    SinusoidalPositions,
    build_positions,
    embedding_scale,
    sinusoidal_positions,
)
from attnlab.nn.projection import Linear, linear

__all__ = [
    "ACTIVATIONS",
    "NORM_ORDERS",
    "POSITIONS",
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
