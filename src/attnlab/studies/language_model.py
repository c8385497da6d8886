"""Any language model attnlab reads, as one object: a trained run folder, a Hugging Face causal-LM
folder (any causal family of `attnlab.families`) or a GGUF file, with its tokenizer and the context
it reads.

What `attnlab eval FOLDER|RUN --data FILE` and lm-evaluation-harness's `attnlab` model load. It
sits with the studies because every source is loaded through `attnlab.train.load.load_any` (the
layer below: `attnlab.tasks.sources.load_checkpoint` with the run loader of `attnlab.load`).
"""

from dataclasses import dataclass
from pathlib import Path

import torch

from attnlab.data.tokenizers import BPETokenizer, Tokenizer
from attnlab.errors import UserError
from attnlab.families import CAUSAL_LM
from attnlab.models import GPT
from attnlab.sources import takes_words


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
    """"run", a Hugging Face folder's model_type ("llama") or a GGUF file's general.architecture."""


def load_language_model(
    path: str | Path, *, device: str | torch.device = "cpu", checkpoint: str | int = "best", command: str = "eval"
) -> LanguageModel:
    """A run folder of a language model, a Hugging Face causal-LM folder (config.json, weights,
    tokenizer.json) or a GGUF file -> `LanguageModel`. checkpoint: a run's "best", "last" or a step
    (the others have one set of weights). command: the one whose refusals are given
    (`attnlab.sources.refusal`). Raises `UserError` for another kind of run or checkpoint and
    `CheckpointError` for one that cannot be read (no tokenizer.json, say)."""
    from attnlab.train.load import load_any

    path = Path(path)
    loaded = load_any(path, command=command, device=device, checkpoint=checkpoint, kinds=(CAUSAL_LM,))
    if loaded.run is None:
        block = loaded.model.config.block_size  # a published checkpoint reads at most its context
        return LanguageModel(path, loaded.model, loaded.tokenizer, block, block, str(loaded.source.model_type))
    if loaded.task != "language-model":
        raise UserError(
            f"{path} is a {loaded.task!r} run; perplexity and lm-evaluation-harness take a language model: "
            + takes_words((CAUSAL_LM,)).replace("a run folder", "a `language-model` run folder", 1)
        )
    model = loaded.model
    return LanguageModel(path, model, loaded.tokenizer, model.config.block_size, model.max_context, "run")


def encode(tokenizer: Tokenizer, text: str, *, special: bool | None = None) -> list[int]:
    """text -> token ids. special: None encodes as the tokenizer does by default (a Hugging Face
    tokenizer.json's post-processor adds Llama's "<s>"), False without the special tokens a
    post-processor adds, True with them. Tokenizers without special tokens ignore it."""
    if special is None or not isinstance(tokenizer, BPETokenizer):
        return tokenizer.encode(text)
    return tokenizer.tokenizer.encode(text, add_special_tokens=special).ids
