"""The model families. Each model file reads like its paper; shared blocks live in attnlab.nn."""

from attnlab.models.gpt import GPT, GPTConfig

__all__ = ["GPT", "GPTConfig"]
