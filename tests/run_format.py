"""What tests/fixtures/run-format2/ holds and how its logits are read back: one tiny run folder of
each model family, written by attnlab as it was on 2026-11-27 (before issue 45 renamed configs and
tasks), with a batch of inputs and the logits the model gave on them.

`PROBES[family]` names the inputs a family's model takes and computes its logits from them; the
fixture's generator (tests/fixtures/make_run_format2.py) and its test (tests/train/test_run_format2.py)
share it, so that what was saved and what is compared are the same computation.
"""

from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from attnlab.models.pixels import pixel_logits

FOLDER = Path(__file__).parent / "fixtures" / "run-format2"
INPUTS = "probe-inputs.safetensors"
LOGITS = "probe-logits.safetensors"


KEPT = 4096
"""Logits kept per family: at most this many values, evenly spread over the flattened tensor (an
image model's 256 levels for every pixel would be megabytes)."""


def kept_values(logits: torch.Tensor) -> torch.Tensor:
    """`KEPT` values of `logits`, evenly spaced over its flattened elements (all of them if fewer)."""
    flat = logits.reshape(-1)
    if flat.numel() <= KEPT:
        return flat
    return flat[torch.linspace(0, flat.numel() - 1, KEPT).round().long()]


def _nodes(model: nn.Module, t: dict[str, torch.Tensor]) -> torch.Tensor:
    return model(t["features"].to_sparse_csr(), t["edges"])


PROBES: dict[str, tuple[tuple[str, ...], Callable[[nn.Module, dict[str, torch.Tensor]], torch.Tensor]]] = {
    "gpt": (("x",), lambda m, t: m(t["x"])),
    "translation": (("src", "tgt_in"), lambda m, t: m(t["src"], t["tgt_in"])),
    "translation-rnn": (("src", "tgt_in"), lambda m, t: m(t["src"], t["tgt_in"])),
    "bert-mlm": (("inputs", "chosen"), lambda m, t: m(t["inputs"], chosen=t["chosen"])),
    "bert-classification": (("ids",), lambda m, t: m(t["ids"])),
    "bert-tagging": (("ids",), lambda m, t: m(t["ids"])),
    "vit": (("images",), lambda m, t: m(t["images"])),
    "pixelcnn": (("x", "labels"), lambda m, t: pixel_logits(m, t["x"], t["labels"])),
    "gated-pixelcnn": (("x", "labels"), lambda m, t: pixel_logits(m, t["x"], t["labels"])),
    "pixel-gpt": (("x", "labels"), lambda m, t: pixel_logits(m, t["x"], t["labels"])),
    "wavenet": (("inputs", "digits"), lambda m, t: m(t["inputs"], t["digits"], None)),
    "gat": (("features", "edges"), _nodes),
    "gcn": (("features", "edges"), _nodes),
}
"""family -> (the names of the inputs saved, logits from the model and those inputs)."""
