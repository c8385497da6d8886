"""Decoding strategies: pure functions over a model that exposes `forward` and a KV cache.

The names below load with the module that holds them, on first use (PEP 562): importing a
torch-free module of this package (`attnlab.decode.scheduler`, `attnlab.decode.requests`) then
imports no PyTorch.
"""

from importlib import import_module

_HOMES = {
    "generate_tokens": "sampling",
    "greedy": "sampling",
    "greedy_picker": "sampling",
    "sample": "sampling",
    "sampling_picker": "sampling",
    "top_k_filter": "sampling",
    "top_p_filter": "sampling",
    "ModelDrafter": "speculative",
    "PromptLookup": "speculative",
    "Speculation": "speculative",
    "SpeculationStats": "speculative",
    "speculative_generate": "speculative",
    "complete": "text",
    "encode_prompt": "text",
    "stream_text": "text",
}
"""Each name this package exports, and the module of it that defines it."""


def __getattr__(name: str):
    if name in _HOMES:
        return getattr(import_module(f"attnlab.decode.{_HOMES[name]}"), name)
    raise AttributeError(f"module 'attnlab.decode' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})


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
