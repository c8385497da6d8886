"""Shared setup for the attnlab.decode tests: a tiny seeded GPT, single-threaded by tests/conftest.py."""

import pytest
import torch

from attnlab.models import GPT, GPTConfig


def tiny_gpt(vocab_size: int = 23, seed: int = 0, weight_std: float = 0.5, **overrides) -> GPT:
    """A random GPT small enough to decode hundreds of tokens in milliseconds.

    GPT-2's initialisation (std 0.02, tied embeddings) makes an untrained model repeat its last
    input token forever, which would let a broken cache or window pass any comparison. Matrices
    (embeddings and positions included) are redrawn with `weight_std`, and the head is untied, so
    greedy continuations wander over the vocabulary and depend on positions."""
    torch.manual_seed(seed)
    fields = dict(vocab_size=vocab_size, block_size=16, n_layers=2, n_heads=2, d_model=32, tie_weights=False)
    model = GPT(GPTConfig(**(fields | overrides)))
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, weight_std)
    return model.eval()


@pytest.fixture
def make_gpt():
    """The tiny_gpt factory, for tests that need several models or other sizes."""
    return tiny_gpt


@pytest.fixture
def gpt() -> GPT:
    return tiny_gpt()
