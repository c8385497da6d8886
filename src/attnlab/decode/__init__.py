"""Decoding strategies: pure functions over a model that exposes `forward` and a KV cache."""

from attnlab.decode.sampling import (
    generate_tokens,
    greedy,
    greedy_picker,
    sample,
    sampling_picker,
    top_k_filter,
    top_p_filter,
)
from attnlab.decode.text import complete, encode_prompt, stream_text

__all__ = [
    "complete",
    "encode_prompt",
    "generate_tokens",
    "greedy",
    "greedy_picker",
    "sample",
    "sampling_picker",
    "stream_text",
    "top_k_filter",
    "top_p_filter",
]
