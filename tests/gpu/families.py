"""Each model family as `attnlab train` builds it: a shipped preset, `--set` overrides that make it
tiny, and the `--data-dir` of a fixture slice; plus how to get its logits from one batch.

The configs go through the CLI's own path (`load_preset_or_file`, `parse_overrides`,
`apply_overrides`, `resolve`), so a preset that no longer trains on a device fails here too.
"""

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attnlab.config import load_preset_or_file, parse_overrides
from attnlab.data.mlm import IGNORE_INDEX
from attnlab.models.pixels import pixel_logits
from attnlab.tasks import TASKS
from attnlab.train import RunConfig, resolve
from attnlab.train.config import apply_overrides
from helpers import FIXTURES

Logits = Callable[[Any, nn.Module, Any, torch.device], torch.Tensor]

# A BERT small enough for the fixtures (a 400-word vocabulary, sentences under 64 tokens).
TINY_BERT = ("model.max_len=64", "model.d_model=32", "model.n_heads=2", "model.n_layers=2", "model.d_ff=64")
TINY_IMAGES = ("data.val_size=50", "data.eval_images=50")
# The tiny models learn visibly within a few dozen steps at this rate (the presets' own suit their size).
FAST = "train.learning_rate=3e-3"


@dataclass(frozen=True)
class Family:
    name: str
    preset: str
    data_dir: Path | None
    """The fixture folder given as --data-dir; None for a preset that reads the bundled text."""
    overrides: tuple[str, ...]
    """--set KEY=VALUE: a tiny model, and data settings that fit the fixture slice."""

    def config(self, *more: str) -> RunConfig:
        """The preset with the family's overrides, then `more`, as `attnlab train` resolves them."""
        _, doc = load_preset_or_file(self.preset)
        overrides = parse_overrides([*self.overrides, *more])
        if self.data_dir is not None:
            overrides.setdefault("data", {})["data_dir"] = str(self.data_dir)
        return resolve(apply_overrides(doc, overrides))

    def task(self, config: RunConfig, folder: Path) -> Any:
        """The task object the trainer would open in run folder `folder` (its tokenizer written there)."""
        return TASKS[config.task](config.data, config.model, folder, batch_size=config.train.batch_size)


FAMILIES = {
    f.name: f
    for f in (
        Family(
            "gpt",
            "shakespeare-char",
            None,
            (
                "model.block_size=32",
                "model.n_layers=2",
                "model.n_heads=2",
                "model.d_model=32",
                "train.batch_size=8",
                FAST,
            ),
        ),
        Family(
            "translation",
            "multi30k-de-en",
            FIXTURES / "multi30k",
            (
                "model.d_model=32",
                "model.n_heads=2",
                "model.d_ff=64",
                "model.n_encoder_layers=1",
                "model.n_decoder_layers=2",
                "data.vocab_size=300",
                "data.max_tokens=2000",
                FAST,
            ),
        ),
        Family(
            "translation-rnn",
            "multi30k-de-en-rnn-attention",
            FIXTURES / "multi30k",
            ("model.emb_dim=16", "model.hidden_size=16", "data.vocab_size=300", "data.max_tokens=2000", FAST),
        ),
        # The masked-LM presets ask for attnlab's C++ kernels (fused_kernels = true), which compute on
        # the CPU alone; "auto" leaves them out of a GPU run instead of building them for nothing.
        Family(
            "bert-mlm",
            "wikitext2-mlm",
            FIXTURES / "wikitext",
            (*TINY_BERT, "data.vocab_size=400", "train.batch_size=16", "train.fused_kernels='auto'", FAST),
        ),
        Family(
            "bert-classification",
            "sst2",
            FIXTURES / "sst2",
            (*TINY_BERT, "data.vocab_size=400", "data.val_size=40", "data.max_len=64", "data.max_tokens=600", FAST),
        ),
        Family(
            "bert-tagging",
            "ud-pos",
            FIXTURES / "ud",
            (*TINY_BERT, "data.vocab_size=400", "data.max_len=64", "data.max_tokens=600", FAST),
        ),
        Family(
            "vit",
            "fashion-vit",
            FIXTURES / "fashion-mnist",
            (
                "model.d_model=16",
                "model.n_heads=2",
                "model.n_layers=1",
                "model.d_ff=32",
                "train.batch_size=32",
                *TINY_IMAGES,
                FAST,
            ),
        ),
        Family(
            "pixelcnn",
            "fashion-pixelcnn",
            FIXTURES / "fashion-mnist",
            ("model.hidden=8", "model.n_layers=2", "model.head_channels=16", *TINY_IMAGES, FAST),
        ),
        Family(
            "gated-pixelcnn",
            "fashion-gated-pixelcnn",
            FIXTURES / "fashion-mnist",
            ("model.hidden=8", "model.n_layers=2", "model.head_channels=16", *TINY_IMAGES, FAST),
        ),
        Family(
            "pixel-gpt",
            "fashion-igpt",
            FIXTURES / "fashion-mnist",
            ("model.n_layers=1", "model.n_heads=2", "model.d_model=16", "train.batch_size=4", *TINY_IMAGES, FAST),
        ),
        Family(
            "wavenet",
            "fsdd-wavenet",
            FIXTURES / "fsdd",
            (
                "model.residual_channels=8",
                "model.dilation_channels=8",
                "model.skip_channels=8",
                "model.layers_per_block=4",
                "model.n_blocks=1",
                "data.val_size=4",
                "data.segment=300",
                "data.eval_clips=4",
                FAST,
            ),
        ),
        # The paper's learning rate barely moves the 60-node slice in a few steps (tests/tasks/test_nodes.py).
        Family("gat", "cora-gat", FIXTURES / "planetoid", ("train.learning_rate=0.05",)),
        Family("gcn", "cora-gcn", FIXTURES / "planetoid", ("train.learning_rate=0.05",)),
    )
}


# -- each task's logits for one of its training batches, on `device` --------------------------------
def _lm(task, model, batch, device):
    x, _ = batch
    return model(x.to(device))  # (B, T, V)


def _translation(task, model, batch, device):
    return model(batch.src.to(device), batch.tgt_in.to(device))  # (B, T, V)


def _mlm(task, model, batch, device):
    inputs, labels = (t.to(device) for t in batch)
    return model(inputs, chosen=labels != IGNORE_INDEX)  # (N, V): the masked positions, as the loss takes them


def _encoder(task, model, batch, device):
    ids, _, *extra = batch
    return task.logits(model, ids.to(device), *(t.to(device) for t in extra))  # (B, L) or (B, T, L)


def _image_classes(task, model, batch, device):
    return model(batch[0].to(device))  # (B, L)


def _pixels(task, model, batch, device):
    x, labels = batch
    return pixel_logits(model, x.to(device), labels.to(device))  # (B, 256, H, W)


def _audio(task, model, batch, device):
    inputs, _, digits, _ = batch
    return model(inputs.to(device), digits.to(device), None)  # (B, 256, T); no speaker conditioning here


def _nodes(task, model, batch, device):
    features, edges, _ = task.inputs(device)
    return model(features, edges)  # (N, L): the whole graph


LOGITS: dict[str, Logits] = {
    "language-model": _lm,
    "translation": _translation,
    "masked-lm": _mlm,
    "text-classification": _encoder,
    "token-classification": _encoder,
    "image-classification": _image_classes,
    "image-density": _pixels,
    "audio-density": _audio,
    "node-classification": _nodes,
}
