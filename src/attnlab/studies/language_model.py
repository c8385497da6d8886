"""Any language model attnlab reads, as one object: a trained run folder or a Hugging Face
causal-LM folder (GPT-2, Llama, Mixtral), with its tokenizer and the context it reads.

What `attnlab eval FOLDER|RUN --data FILE` and lm-evaluation-harness's `attnlab` model load. It
sits with the studies because a run folder is loaded through `attnlab.train.load` (the layer
below), and a Hugging Face folder through `attnlab.models.hf.load_causal_lm`.
"""

from dataclasses import dataclass
from pathlib import Path

import torch

from attnlab.data.tokenizers import BPETokenizer, Tokenizer
from attnlab.errors import UserError
from attnlab.models import GPT


@dataclass
class LanguageModel:
    """A causal language model ready to score and continue text."""

    path: Path
    model: GPT
    """In eval mode, on the device asked for."""
    tokenizer: Tokenizer
    context: int
    """The context it was trained or published with: block_size, or a Hugging Face config's
    n_positions / max_position_embeddings."""
    max_context: int | None
    """The most tokens it may read at once: `context` for a Hugging Face folder (its config says
    so), the position scheme's limit for a run (None: computed positions run past training)."""
    source: str
    """"run" or the Hugging Face model_type ("gpt2", "llama", "mixtral")."""


def load_language_model(
    path: str | Path, *, device: str | torch.device = "cpu", checkpoint: str | int = "best"
) -> LanguageModel:
    """A run folder of a language model, or a Hugging Face causal-LM folder (config.json, weights,
    tokenizer.json) -> `LanguageModel`. checkpoint: a run's "best", "last" or a step (a Hugging
    Face folder has one set of weights). Raises `UserError` for another kind of run and
    `CheckpointError` for a folder that cannot be read (no tokenizer.json, say)."""
    from attnlab.models.hf.auto import is_hf_folder, load_causal_lm

    path = Path(path)
    if is_hf_folder(path):
        loaded = load_causal_lm(path)
        model = loaded.model.to(device)
        block = model.config.block_size
        return LanguageModel(path, model, loaded.tokenizer, block, block, loaded.model_type)
    from attnlab.train.load import load_run

    run = load_run(path, device=device, checkpoint=checkpoint)
    if run.config.task != "language-model":
        raise UserError(
            f"{path} is a {run.config.task!r} run; perplexity and lm-evaluation-harness take a language "
            "model (a `language-model` run, or a Hugging Face GPT-2, Llama or Mixtral folder)"
        )
    model = run.model
    return LanguageModel(path, model, run.tokenizer, model.config.block_size, model.max_context, "run")


def encode(tokenizer: Tokenizer, text: str, *, special: bool | None = None) -> list[int]:
    """text -> token ids. special: None encodes as the tokenizer does by default (a Hugging Face
    tokenizer.json's post-processor adds Llama's "<s>"), False without the special tokens a
    post-processor adds, True with them. Tokenizers without special tokens ignore it."""
    if special is None or not isinstance(tokenizer, BPETokenizer):
        return tokenizer.encode(text)
    return tokenizer.tokenizer.encode(text, add_special_tokens=special).ids
