"""LoRA fine-tuning of a run's model (`train.lora`; Hu et al. 2021; the layers: `attnlab.nn.lora`).

`apply_lora` freezes the model, puts adapters on the targeted parts of every block, and leaves a
new task head (a classifier's or a tagger's) fully trainable; the trainer calls it before it builds
the optimizer, which then holds the adapters and the head alone.

The base is the run's `data.init_from` (a Hugging Face folder or an attnlab run): a checkpoint of
a LoRA run holds only what trains (adapters, head; the token tables of a chat run that added tokens
to its base's vocabulary, `new_token_tables`) and, in its manifest, the base's path and
`attnlab.checkpoints.weights_sha256`. A run resumed, or loaded for use, reads the base again from
that path and refuses one whose hash has changed. A LoRA run with no `init_from` (a model built from
its config) has no base elsewhere: its checkpoints hold the whole model.
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attnlab.checkpoints import latest_checkpoint, weights_sha256
from attnlab.errors import CheckpointError, ConfigError, UserError
from attnlab.models.bert import Bert, ClassifierHead
from attnlab.nn.lora import add_lora, lora_layers
from attnlab.nn.positions import LearnedPositions
from attnlab.tasks.chat import grown_state
from attnlab.train.config import LoRAConfig, RunConfig

LORA_TASKS = ("language-model", "chat", "text-classification", "token-classification")
"""The tasks `train.lora` applies to."""
TOKEN_TABLES = ("token_embedding.weight", "lm_head.weight", "lm_head.bias")
"""A GPT's rows by token id: what grows where a chat run adds tokens to its base's vocabulary."""


@dataclass(frozen=True)
class LoRASetup:
    """What a LoRA run's checkpoints need to know: which layers carry adapters, which state-dict
    entries the base holds (left out of the checkpoints), and the base's record."""

    wrapped: list[str]
    frozen: frozenset[str]
    """State-dict names that come from the base, not from the run's checkpoints (none without a base)."""
    base: dict[str, str] | None
    """{"path": ..., "weights_sha256": ...}; None for a run with no `init_from`."""


def apply_lora(model: nn.Module, config: LoRAConfig) -> list[str]:
    """Freeze every weight of `model`, add adapters on the `config.targets` parts (trainable) and
    unfreeze a new task head; returns the names of the linear layers adapted. A target that no
    layer of this model holds is a `ConfigError`."""
    model.requires_grad_(False)
    try:
        wrapped = add_lora(model, config.targets, config.rank, config.alpha, config.dropout)
    except ValueError as e:
        raise ConfigError(f"train.lora.targets: {e}") from None
    if (head := new_head(model)) is not None:
        head.requires_grad_(True)  # a task head is new: it has nothing to adapt from
    return wrapped


def new_head(model: nn.Module) -> nn.Module | None:
    """The part of `model` that fine-tuning adds and trains in full: a BERT's classifier or
    tagger head (None for a language model, whose output layer is the base's)."""
    if isinstance(model, Bert) and isinstance(model.head, ClassifierHead):
        return model.head
    return None


def trainable_names(model: nn.Module) -> set[str]:
    """The names of the parameters that train (requires_grad)."""
    return {name for name, p in model.named_parameters() if p.requires_grad}


def check_task(config: RunConfig) -> None:
    """A `ConfigError` where `train.lora` is set for a task it does not apply to."""
    if config.task not in LORA_TASKS:
        raise ConfigError(f"train.lora is for the {', '.join(LORA_TASKS)} tasks, not {config.task!r}")


def base_path(config: RunConfig) -> str:
    """The run's base: its `data.init_from` ("" where it has none)."""
    return getattr(config.data, "init_from", "") or ""


def base_record(path: str) -> dict[str, str]:
    """The reference a LoRA checkpoint keeps to its base: its path and its weights' hash."""
    try:
        return {"path": path, "weights_sha256": weights_sha256(Path(path))}
    except OSError as e:
        raise UserError(f"the LoRA base {path} cannot be read ({e}); restore it or start a new run") from None


def check_base(run_dir: Path, recorded: dict[str, Any] | None, path: str, *, doing: str) -> dict[str, str]:
    """The base's record, after checking it against the one the run's checkpoint holds: a
    `CheckpointError` naming both hashes where the base has changed since."""
    now = base_record(path)
    if recorded is not None and recorded.get("weights_sha256") != now["weights_sha256"]:
        raise CheckpointError(
            f"cannot {doing} {run_dir}: its LoRA base {path} has changed (weights_sha256 "
            f"{recorded.get('weights_sha256')} when the run saved its adapters, {now['weights_sha256']} now); "
            "restore the base the run started from, or fine-tune a new run on this one"
        )
    return now


def load_base(model: nn.Module, path: str) -> frozenset[str]:
    """Copy the weights of the base in `path` (an attnlab run's best, a Hugging Face folder or a
    GGUF file: `attnlab.tasks.sources.load_checkpoint`) into `model`, a model of the same shape: all
    of them, or for a BERT with a new head, the encoder's (`Bert.load_encoder`). Returns the
    state-dict names it loaded: what a LoRA checkpoint leaves to the base (a BERT's pooler that the
    base lacks is saved with the run)."""
    from attnlab.families import CAUSAL_LM, ENCODER
    from attnlab.tasks.sources import load_checkpoint

    kind = ENCODER if isinstance(model, Bert) else CAUSAL_LM
    base = load_checkpoint(path, command="train --init-from", kinds=(kind,))
    if isinstance(model, Bert):
        # A BertForMaskedLM folder has no pooler: the loader leaves it at a random initialisation,
        # which the run must save as its own, since reading the folder again would draw another.
        source, absent = base.model.state_dict(), set(base.missing)
        missing = model.load_encoder(source)
        return frozenset(name for name in source if name in model.state_dict()) - set(missing) - absent
    state = cropped(base.model.state_dict(), model)
    added = getattr(model.config, "vocab_size", 0) - getattr(base.model.config, "vocab_size", 0)
    if added > 0:  # the chat task's tokens, as the task grew them (`attnlab.tasks.chat.grown_state`)
        state = grown_state(state, model.config, added)
    model.load_state_dict(state)
    return frozenset(model.state_dict()) - (new_token_tables(model) if added > 0 else frozenset())


def new_token_tables(model: nn.Module) -> frozenset[str]:
    """The state-dict names of a causal LM's token tables (embedding, head), which train in full
    where the run added tokens to its base's vocabulary: a new token's row starts as the mean row,
    so frozen, the chat task's <|im_start|> and <|im_end|> would stay one and the same token (what
    PEFT's `modules_to_save` does for an embedding whose tokens were added)."""
    return frozenset(TOKEN_TABLES) & frozenset(model.state_dict())


def train_new_token_tables(model: nn.Module, provided: frozenset[str]) -> None:
    """Unfreeze the token tables the base did not provide (`load_base`): the run trains and saves them."""
    for name in new_token_tables(model) - provided:
        model.get_parameter(name).requires_grad_(True)


def cropped(state: dict[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    """`state` fitted to `model` where a fine-tuning run trains on a shorter context than its
    base's: a learned position table keeps its first rows (nanoGPT's crop_block_size); anything
    else must fit as it is (`load_state_dict` names what does not)."""
    out = dict(state)
    for name, module in model.named_modules():
        if isinstance(module, LearnedPositions):
            key = f"{name}.embedding.weight" if name else "embedding.weight"
            if key in out:
                out[key] = out[key][: module.max_positions]
    return out


def set_up_lora(model: nn.Module, config: RunConfig, run_dir: Path, *, resume: bool) -> LoRASetup | None:
    """The trainer's one call (None where `train.lora` is off): the base checked against the
    checkpoint's record (on resume) and loaded into `model` (again, in a new run whose task has
    loaded it: so that what the checkpoints leave out is exactly what the base holds); then
    `apply_lora`."""
    lora = config.train.lora
    if lora is None:
        return None
    check_task(config)
    path = base_path(config)
    if not path:
        return LoRASetup(apply_lora(model, lora), frozenset(), None)
    recorded = latest_checkpoint(run_dir).manifest.get("base") if resume else None
    base = check_base(run_dir, recorded, path, doing="resume")
    provided = load_base(model, path)
    wrapped = apply_lora(model, lora)
    train_new_token_tables(model, provided)
    return LoRASetup(wrapped, provided - trainable_names(model), base)


def prepare_for_use(model: nn.Module, config: RunConfig, run_dir: Path) -> frozenset[str]:
    """A LoRA run's model as `attnlab.load` builds it, before its checkpoint is read: the base
    loaded (and checked) and the adapters added. Returns the state-dict names the checkpoint
    does not hold (those of the base)."""
    path, provided = base_path(config), frozenset()
    if path:
        check_base(run_dir, latest_checkpoint(run_dir).manifest.get("base"), path, doing="load")
        provided = load_base(model, path)
    apply_lora(model, config.train.lora)
    if path:
        train_new_token_tables(model, provided)
    return provided - trainable_names(model)


def trainable_share(model: nn.Module) -> tuple[int, int]:
    """(trainable parameters, all parameters) of `model`."""
    params = {id(p): p for p in model.parameters()}.values()
    return sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params)


def describe(setup: LoRASetup, model: nn.Module) -> str:
    """The log's line on a LoRA run."""
    trainable, total = trainable_share(model)
    where = f"base {setup.base['path']}" if setup.base else "no base (the model built from its config)"
    return (
        f"LoRA: adapters on {len(lora_layers(model))} layers, {trainable:,} of {total:,} parameters train "
        f"({100 * trainable / total:.2f}%); {where}"
    )
