"""Building blocks shared by every model: attention, masks, positions, feed-forward, blocks, graph operations."""

from attnlab.nn.attention import KVCache, MultiHeadAttention, scaled_dot_product_attention
from attnlab.nn.blocks import NORM_ORDERS, DecoderBlock, TransformerBlock
from attnlab.nn.feedforward import ACTIVATIONS, FeedForward
from attnlab.nn.graph import add_self_loops, dropout, in_degree, segment_softmax, segment_sum, undirected
from attnlab.nn.init import normal_init
from attnlab.nn.masks import adjacency_mask, causal_mask, padding_mask, padding_mask_from_ids
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
    "add_self_loops",
    "adjacency_mask",
    "build_positions",
    "causal_mask",
    "embedding_scale",
    "dropout",
    "in_degree",
    "linear",
    "normal_init",
    "padding_mask",
    "padding_mask_from_ids",
    "scaled_dot_product_attention",
    "segment_softmax",
    "segment_sum",
    "sinusoidal_positions",
    "undirected",
]
