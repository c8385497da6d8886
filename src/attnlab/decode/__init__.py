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
from attnlab.decode.speculative import (
    ModelDrafter,
    PromptLookup,
    Speculation,
    SpeculationStats,
    speculative_generate,
)
from attnlab.decode.text import complete, encode_prompt, stream_text

__all__ = [
    "ModelDrafter",
    "PromptLookup",
    "Speculation",
    "SpeculationStats",
    "complete",
    "encode_prompt",
    "generate_tokens",
    "greedy",
    "greedy_picker",
    "sample",
    "sampling_picker",
    "speculative_generate",
    "stream_text",
    "top_k_filter",
    "top_p_filter",
]
