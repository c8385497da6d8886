"""A trained model from a run folder: the task's model built from the config the run saved, with
its checked weights (`attnlab.checkpoints`), and the run's tokenizer.

`attnlab.train.load.load_run` (what `attnlab.load` returns) and a fine-tuning run that starts
from another run (`tasks.encoder`, `--init-from`) both load through `load_trained`. The task
registry lives in this layer, so the tasks need nothing from the layers above them: where they
need a run's model config they read it with `saved_model_config`.
"""

from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from attnlab.checkpoints import CONFIG, TOKENIZER, load_weights, read_config_toml
from attnlab.config import build
from attnlab.data.tokenizers import Tokenizer, load_tokenizer
from attnlab.errors import CheckpointError, ConfigError
from attnlab.names import upgrade
from attnlab.tasks import TASKS


@dataclass
class Trained:
    model: nn.Module
    tokenizer: Tokenizer | None
    """None for a task without one (node classification)."""
    step: int
    """The step of the weights loaded."""


def load_trained(
    run_dir: Path,
    task: str,
    model_config: Any,
    *,
    best: bool,
    step: int | None = None,
    prepare: Callable[[nn.Module], Collection[str]] | None = None,
) -> Trained:
    """The model of a `task` run in `run_dir`, built from `model_config` with the best weights (or,
    without a best or `best` False, the newest checkpoint's; or checkpoint `step`'s where given), and
    its tokenizer; on the CPU. `prepare(model)`, where given, readies the built model before its
    checkpoint is read (a LoRA run's base and adapters) and returns the state-dict names that the
    checkpoint does not hold."""
    task_class = TASKS[task]
    model = task_class.build_model_from_config(model_config)
    frozen = prepare(model) if prepare is not None else ()
    step = load_weights(run_dir, model, best=best, step=step, frozen=frozen)
    tokenizer = load_tokenizer(run_dir / TOKENIZER) if getattr(task_class, "uses_tokenizer", True) else None
    return Trained(model, tokenizer, step)


def saved_model_config(run_dir: Path) -> tuple[str, Any]:
    """(task name, model config) as the run in `run_dir` saved them in its config.toml (the
    training sections, which only `attnlab.train` reads, are left unread)."""
    path = run_dir / CONFIG
    doc = read_config_toml(run_dir)
    try:
        doc = upgrade(doc, TASKS)  # today's task and kind names
        task, values = doc["task"], doc.get("model", {})
        return task, build(TASKS[task].model_config_class(values), values, "model")
    except ConfigError as e:
        raise CheckpointError(f"{path}: {e}") from None
