"""The run folder: everything needed to use or resume a model.

    config.toml          resolved configuration (TOML, with a format version)
    tokenizer.json       the tokenizer
    checkpoints/, model.safetensors, train_state.pt, checkpoint.json, best.safetensors, best.json
                         the checkpoints: see `attnlab.checkpoints`, which writes and reads them
                         (re-exported here, where the rest of the package has always found them)
    metrics.csv          one row per log or eval event

This half knows the tasks: it reads config.toml into a `RunConfig` and loads a run for use
(`load_run`, what `attnlab.load` returns).
"""

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from attnlab.checkpoints import (
    BEST_MANIFEST,
    BEST_WEIGHTS,
    CHECKPOINT_FORMAT_VERSION,
    CHECKPOINTS,
    CONFIG,
    MANIFEST,
    PAUSE_HOOK,
    TOKENIZER,
    TRAIN_STATE,
    WEIGHTS,
    Checkpoint,
    complete_steps,
    file_sha256,
    has_checkpoint,
    latest_checkpoint,
    load_train_state,
    load_weights,
    prune,
    publish,
    read_manifest,
    runs_inside,
    save_checkpoint,
    step_dir,
)
from attnlab.config import read_toml
from attnlab.data.tokenizers import Tokenizer
from attnlab.errors import CheckpointError, ConfigError
from attnlab.fileio import atomic_write_text
from attnlab.tasks.trained import load_trained
from attnlab.train.config import RunConfig, resolve

__all__ = [
    "BEST_MANIFEST",
    "BEST_WEIGHTS",
    "CHECKPOINTS",
    "CHECKPOINT_FORMAT_VERSION",
    "CONFIG",
    "Checkpoint",
    "MANIFEST",
    "PAUSE_HOOK",
    "Run",
    "TOKENIZER",
    "TRAIN_STATE",
    "WEIGHTS",
    "complete_steps",
    "file_sha256",
    "has_checkpoint",
    "latest_checkpoint",
    "load_run",
    "load_train_state",
    "load_weights",
    "prune",
    "publish",
    "read_config",
    "read_manifest",
    "save_checkpoint",
    "step_dir",
    "write_config",
]


def write_config(run_dir: Path, config: RunConfig) -> None:
    atomic_write_text(run_dir / CONFIG, config.to_toml())


def read_config(run_dir: Path) -> RunConfig:
    path = run_dir / CONFIG
    if not path.exists():
        runs = runs_inside(run_dir) if run_dir.is_dir() else []
        if runs:  # an ablation or scaling study: the runs are one or two levels down
            shown = ", ".join(str(r) for r in runs[:3]) + (", ..." if len(runs) > 3 else "")
            raise CheckpointError(
                f"{run_dir} is not a run folder but holds {len(runs)} runs ({shown}), as `attnlab ablate` and "
                "`attnlab scale` write them; pass one of them"
            )
        raise CheckpointError(f"{run_dir} is not a run folder: it has no {CONFIG}")
    try:
        return resolve(read_toml(path))
    except ConfigError as e:
        raise CheckpointError(f"{path}: {e}") from None


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
