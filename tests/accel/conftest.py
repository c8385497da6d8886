"""Shared setup for the attnlab.accel tests: the tiny seeded GPT of the decoding tests
(tests/decode/conftest.py), whose fixtures the fused step's tests take by name."""

from decode.conftest import gpt, make_gpt  # noqa: F401 (fixtures: pytest finds them by name)
