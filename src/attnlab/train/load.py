"""A trained run loaded for use: `load_run`, what `attnlab.load` returns, and the one way every
layer from here up loads a run folder (`attnlab eval`, `attnlab export`, the report, the studies).

It reads the run's config (`train.config.read_config`) and hands the model to
`tasks.trained.load_trained`, which builds it and loads its checked weights and its tokenizer
(the files themselves are `attnlab.checkpoints`'s).
"""

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from attnlab.data.tokenizers import Tokenizer
from attnlab.errors import CheckpointError
from attnlab.tasks.trained import load_trained
from attnlab.train.config import RunConfig, read_config


@dataclass
class Run:
    """A trained run: what `attnlab.load` returns."""

    path: Path
    config: RunConfig
    tokenizer: Tokenizer | None
    """None for a task without one (node classification)."""
    model: nn.Module
    step: int


def load_run(path: str | Path, *, device: str | torch.device = "cpu", checkpoint: str | int = "best") -> Run:
    """A run folder -> its model (in eval mode), tokenizer and config.

    checkpoint: "best" (the weights that scored best on validation, when the run has them, else
    the last), "last" (the latest checkpoint) or a step (the checkpoint saved after that step, from
    checkpoints/step-N or, for the best's step, best.safetensors).
    """
    is_step = isinstance(checkpoint, int) and not isinstance(checkpoint, bool) and checkpoint >= 0
    if checkpoint not in ("best", "last") and not is_step:
        raise ValueError(f"checkpoint must be 'best', 'last' or a step (an integer >= 0), got {checkpoint!r}")
    run_dir = Path(path)
    if not run_dir.is_dir():
        raise CheckpointError(f"run folder {run_dir} does not exist; train one with `attnlab train`")
    config = read_config(run_dir)
    step = checkpoint if is_step else None
    trained = load_trained(run_dir, config.task, config.model, best=checkpoint == "best", step=step)
    return Run(run_dir, config, trained.tokenizer, trained.model.to(device).eval(), trained.step)
