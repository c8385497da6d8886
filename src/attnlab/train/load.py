"""A trained run loaded for use: `load_run`, what `attnlab.load` returns, and the one way every
layer from here up loads a run folder (`attnlab eval`, `attnlab export`, the report, the studies).

It reads the run's config (`train.config.read_config`) and hands the model to
`tasks.trained.load_trained`, which builds it and loads its checked weights and its tokenizer
(the files themselves are `attnlab.checkpoints`'s). `load_any` reads any checkpoint
(`attnlab.tasks.sources.load_checkpoint`) with `load_run` for run folders.
"""

from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
from torch import nn

from attnlab.data.tokenizers import Tokenizer
from attnlab.nn.lora import merge_lora as merge_lora_layers
from attnlab.sources import refuse
from attnlab.tasks.sources import Loaded, load_checkpoint
from attnlab.tasks.trained import load_trained
from attnlab.train.config import RunConfig, read_config
from attnlab.train.lora import prepare_for_use


@dataclass
class Run:
    """A trained run: what `attnlab.load` returns."""

    path: Path
    config: RunConfig
    tokenizer: Tokenizer | None
    """None for a task without one (node classification)."""
    model: nn.Module
    step: int


def load_run(
    path: str | Path, *, device: str | torch.device = "cpu", checkpoint: str | int = "best", merge_lora: bool = True
) -> Run:
    """A run folder -> its model (in eval mode), tokenizer and config.

    checkpoint: "best" (the weights that scored best on validation, when the run has them, else
    the last), "last" (the latest checkpoint) or a step (the checkpoint saved after that step, from
    checkpoints/step-N or, for the best's step, best.safetensors).
    A LoRA run (`train.lora`) is its base (`data.init_from`, checked against the hash its
    checkpoint recorded) with its adapters: merged into the weights (`merge_lora`), so that the
    model is its family's plain model, or kept apart as `LoRALinear` layers.
    """
    is_step = isinstance(checkpoint, int) and not isinstance(checkpoint, bool) and checkpoint >= 0
    if checkpoint not in ("best", "last") and not is_step:
        raise ValueError(f"checkpoint must be 'best', 'last' or a step (an integer >= 0), got {checkpoint!r}")
    run_dir = Path(path)
    refuse(run_dir, "attnlab.load")  # a missing path, a Hugging Face folder, ...: said as every command says it
    config = read_config(run_dir)
    step = checkpoint if is_step else None
    prepare = None if config.train.lora is None else partial(prepare_for_use, config=config, run_dir=run_dir)
    trained = load_trained(run_dir, config.task, config.model, best=checkpoint == "best", step=step, prepare=prepare)
    model = trained.model
    if config.train.lora is not None:
        model.requires_grad_(True)  # as any loaded model: the freezing was the training's
        if merge_lora:
            model = merge_lora_layers(model)
    return Run(run_dir, config, trained.tokenizer, model.to(device).eval(), trained.step)


def load_any(
    path: str | Path,
    *,
    command: str,
    device: str | torch.device = "cpu",
    checkpoint: str | int = "best",
    dtype: torch.dtype = torch.float32,
    kinds: tuple[str, ...] | None = None,
) -> Loaded:
    """Any checkpoint `attnlab COMMAND` takes (`attnlab.tasks.sources.load_checkpoint`), a run
    folder through `load_run` (its `checkpoint`, a LoRA run's adapters merged): `.run` is its `Run`."""
    run_loader = partial(load_run, device=device, checkpoint=checkpoint)
    return load_checkpoint(path, command=command, dtype=dtype, device=device, kinds=kinds, run_loader=run_loader)
