"""Every checkpoint attnlab reads, through one loader: an attnlab run folder, a Hugging Face folder
of any family in `attnlab.families` (a causal LM or an encoder), or a GGUF file.

`load_checkpoint(path, command=...)` first asks `attnlab.sources.refuse` whether `attnlab COMMAND`
takes what is at `path` (one line otherwise: what the path is and what to do), then loads it with
its family's importer (`attnlab.models.hf.auto`'s tables, `attnlab.models.hf.gguf.load_gguf`) or,
for a run folder, with the run loader it is given. The run loader is a parameter because the full
one, `attnlab.train.load.load_run` (a LoRA run's base and adapters, a chosen checkpoint), lives in
the layer above; the default here, `load_trained_run`, is what the tasks' --init-from read (the
best weights of a run that is not a LoRA run). `attnlab.train.load.load_any` passes `load_run`.

The classification itself (`what_is`, `refusal`) is torch-free and lives on the ground floor
(`attnlab.sources`), re-exported here.
"""

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from attnlab.data.tokenizers import Tokenizer
from attnlab.families import Family
from attnlab.sources import GGUF, HF_FOLDER, OTHER_FOLDER, RUN, SourceKind, refusal, refuse, what_is

__all__ = [
    "Loaded",
    "RunLoader",
    "SourceKind",
    "default_weights",
    "load_checkpoint",
    "load_trained_run",
    "refusal",
    "refuse",
    "what_is",
]


class LoadedRun(Protocol):
    """What a run loader returns: `attnlab.load`'s `Run`, or `attnlab.tasks.trained.Trained`."""

    model: nn.Module
    tokenizer: Tokenizer | None
    step: int


RunLoader = Callable[[Path], LoadedRun]


@dataclasses.dataclass
class Loaded:
    """A checkpoint loaded for use, whatever its source."""

    source: SourceKind
    """What the path is (`attnlab.sources.what_is`)."""
    model: nn.Module
    """In eval mode, on the device and in the dtype asked for."""
    tokenizer: Tokenizer | None
    chat_template: str | None
    """The Jinja chat template the checkpoint carries: a GGUF file's `tokenizer.chat_template`, a chat
    run's (its chat_template.jinja). None elsewhere: a Hugging Face folder's is read with its special
    tokens from its files by `attnlab.serve.chat_template.read_chat_template`."""
    family: Family | None
    """The row of `attnlab.families`; None for a run folder."""
    kind: str | None
    """The family's kind (`attnlab.families.CAUSAL_LM`, `ENCODER`); None for a run (see `task`)."""
    model_origin: str
    """Where the weights were read: the weights file, the GGUF file, a run's folder and step."""
    tokenizer_origin: str | None
    chat_template_origin: str | None
    task: str | None = None
    """A run folder's task ("language-model", ...); None for the others."""
    run: Any = None
    """A run folder: what the run loader returned (`attnlab.load`'s `Run`: its config and step)."""
    missing: tuple[str, ...] = ()
    """Parameters the checkpoint has no tensor for, left at their initialisation (the pooler of a
    BertForMaskedLM folder)."""
    stored_weights: str | None = None
    """The fused decoding step's weight format (`attnlab.accel.fused.WEIGHT_FORMATS`) that holds the
    products' weights exactly as the checkpoint stores them: "int8" for a GGUF file whose matrices
    are all Q8_0 (`attnlab.models.hf.gguf.stored_weights`); None elsewhere (fp32 is the model's own)."""


def default_weights(model: nn.Module, stored: str | None, *, fused: bool | None = None) -> str:
    """The fused step's weight format when none is asked for: `stored` (`Loaded.stored_weights`,
    the file's own blocks) where the step covers `model` and is not turned off (`fused` False);
    else fp32, the model's own, without a word (nobody asked for another)."""
    from attnlab.accel.fused import weights_refusal

    if stored is None or fused is False or weights_refusal(model, stored) is not None:
        return "fp32"
    return stored


def load_checkpoint(
    path: str | Path,
    *,
    command: str,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    kinds: tuple[str, ...] | None = None,
    run_loader: RunLoader | None = None,
) -> Loaded:
    """The checkpoint at `path` as `attnlab COMMAND` uses it (a `CheckpointError` with
    `attnlab.sources.refusal`'s line where it does not take it), in eval mode on `device`.
    kinds: the families' kinds taken (default the command's, `attnlab.sources.TAKES`).
    run_loader: how a run folder is read (default `load_trained_run`)."""
    source = refuse(path, command, kinds)
    if source.form in (RUN, OTHER_FOLDER):  # a folder refuse() let through holds runs: the run reader names them
        loaded = _run(source, run_loader or load_trained_run)
    elif source.form == HF_FOLDER:
        loaded = _hf_folder(source, dtype)
    elif source.form == GGUF:
        loaded = _gguf(source, dtype)
    else:  # refuse() lets only the three through
        raise AssertionError(source.form)
    if source.form == RUN and dtype != torch.float32:  # runs are saved in float32
        loaded.model.to(dtype)
    loaded.model.to(device).eval()
    return loaded


def load_trained_run(path: Path) -> LoadedRun:
    """A run folder's best weights and tokenizer (`attnlab.tasks.trained.load_trained`): what the
    tasks' --init-from read. A LoRA run needs its base: `attnlab.train.load.load_run` reads it."""
    from attnlab.tasks.trained import load_trained, saved_model_config  # they import the task registry

    return load_trained(path, *saved_model_config(path), best=True)


def _run(source: SourceKind, run_loader: RunLoader) -> Loaded:
    from attnlab.checkpoints import TOKENIZER
    from attnlab.tasks.chat import saved_chat_template
    from attnlab.tasks.trained import saved_model_config

    task, _ = saved_model_config(source.path)
    run = run_loader(source.path)
    template = saved_chat_template(source.path)  # a chat run's (attnlab.tasks.chat)
    return Loaded(
        source=source,
        model=run.model,
        tokenizer=run.tokenizer,
        chat_template=template,
        family=None,
        kind=None,
        model_origin=f"{source.path} (step {run.step})",
        tokenizer_origin=str(source.path / TOKENIZER) if run.tokenizer is not None else None,
        chat_template_origin=str(source.path / "chat_template.jinja") if template is not None else None,
        task=task,
        run=run,
    )


def _hf_folder(source: SourceKind, dtype: torch.dtype) -> Loaded:
    from attnlab.models.hf._common import TOKENIZER_FILE, WEIGHT_FILES
    from attnlab.models.hf.auto import ENCODER_LOADERS, load_causal_lm
    from attnlab.models.hf.bert import VOCAB_FILE

    folder = source.path
    weights = next((folder / name for name in WEIGHT_FILES if (folder / name).is_file()), folder)
    common = dict(source=source, chat_template=None, chat_template_origin=None, model_origin=str(weights))
    if source.model_type in ENCODER_LOADERS:
        bert = ENCODER_LOADERS[source.model_type](folder, dtype=dtype)
        vocab = TOKENIZER_FILE if (folder / TOKENIZER_FILE).is_file() else VOCAB_FILE  # as load_bert reads it
        return Loaded(
            **common,
            model=bert.model,
            tokenizer=bert.tokenizer,
            family=source.family,
            kind=source.kind,
            tokenizer_origin=str(folder / vocab),
            missing=tuple(bert.missing),
        )
    # A causal LM, or a config.json that refuse() could not read: load_causal_lm names what is wrong.
    lm = load_causal_lm(folder, dtype=dtype)
    return Loaded(
        **common,
        model=lm.model,
        tokenizer=lm.tokenizer,
        family=source.family,
        kind=source.kind,
        tokenizer_origin=str(folder / TOKENIZER_FILE),
    )


def _gguf(source: SourceKind, dtype: torch.dtype) -> Loaded:
    from attnlab.models.hf.gguf import load_gguf  # it names the `gguf` package where that is missing

    lm = load_gguf(source.path, dtype=dtype)
    if lm.stored_weights == "q4_k":  # the file's K-quant blocks, found by the rows' values
        from attnlab.accel.gguf_blocks import keep_file_blocks

        keep_file_blocks(lm.model, source.path)
    return Loaded(
        source=source,
        model=lm.model,
        tokenizer=lm.tokenizer,
        chat_template=lm.chat_template,
        family=source.family,
        kind=source.kind,
        model_origin=str(source.path),
        tokenizer_origin=str(source.path),
        chat_template_origin=f"{source.path} (tokenizer.chat_template)" if lm.chat_template is not None else None,
        stored_weights=lm.stored_weights,
    )
