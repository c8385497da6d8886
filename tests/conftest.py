"""Shared fixtures: a small real corpus and a tiny run configuration that trains in about a second."""

from pathlib import Path

import pytest
import torch

from attnlab.data.text import bundled_shakespeare
from helpers import write_fifty_pairs


@pytest.fixture(autouse=True, scope="session")
def single_thread():
    """The tests use tiny tensors, which gain nothing from intra-op threads; on a busy 2-core
    machine the thread pool's spin-waiting makes the suite many times slower."""
    n_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n_threads)


TINY_TOML = """
task = "lm"

[model]
block_size = 16
n_layers = 2
n_heads = 2
d_model = 32

[data]
path = "{corpus}"
tokenizer = "char"

[train]
max_iters = 8
batch_size = 4
learning_rate = 3e-3
min_lr = 3e-4
warmup_iters = 2
eval_interval = 4
eval_iters = 2
log_interval = 2
"""


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    """The first 20,000 characters of Tiny Shakespeare, as a user's own text file."""
    path = tmp_path / "corpus.txt"
    path.write_text(bundled_shakespeare()[:20_000], encoding="utf-8")
    return path


@pytest.fixture
def tiny_toml(tmp_path: Path, corpus: Path) -> Path:
    path = tmp_path / "tiny.toml"
    path.write_text(TINY_TOML.format(corpus=corpus.as_posix()), encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def fifty_pairs(tmp_path_factory) -> Path:
    """A Multi30k-shaped folder whose every split is the same 50 real training pairs."""
    return write_fifty_pairs(tmp_path_factory.mktemp("fifty"))
