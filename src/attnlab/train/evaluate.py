"""A trained run scored on one split of its data: what `attnlab eval` prints, as a function."""

import dataclasses
from pathlib import Path
from typing import Any

import torch

from attnlab.errors import UserError
from attnlab.tasks import TASKS
from attnlab.train.load import Run, load_run


def evaluate_run(
    run_dir: str | Path,
    split: str,
    *,
    device: torch.device | str = "cpu",
    checkpoint: str = "best",
    data_dir: str | None = None,
    beam: int = 5,
    context: int | None = None,
    max_tokens: int | None = None,
) -> tuple[Run, dict[str, Any]]:
    """Load `run_dir` (its best or last weights) and evaluate it on `split` with its task's metric.

    data_dir: read the split from this folder instead of the run's `data.data_dir`.
    beam: the beam size of translation runs (other tasks ignore it).
    context, max_tokens: language models only: blocks of `context` tokens instead of the training
    block_size, and only the split's first `max_tokens` tokens.
    Returns the loaded run and the task's metrics (e.g. {"accuracy": ..., "test_loss": ..., "examples": ...}).
    """
    run = load_run(run_dir, device=device, checkpoint=checkpoint)
    data = run.config.data
    if data_dir:
        if not hasattr(data, "data_dir"):
            raise UserError(f"--data-dir is for tasks that read a data folder, not a {run.config.task!r} run")
        data = dataclasses.replace(data, data_dir=data_dir)
    extra = {}
    for flag, value in (("context", context), ("max_tokens", max_tokens)):
        if value is not None:
            if run.config.task != "lm":
                raise UserError(f"--{flag.replace('_', '-')} is for language models, not a {run.config.task!r} run")
            if value < 1:
                raise UserError(f"--{flag.replace('_', '-')} must be >= 1, got {value}")
            extra[flag] = value
    task = TASKS[run.config.task](data, run.config.model, run.path, resume=True, splits=(split,))
    return run, task.evaluate(run.model, torch.device(device), split=split, beam=beam, **extra)
