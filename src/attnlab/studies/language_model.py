"""Any language model attnlab reads, loaded as one object (`attnlab.eval.language_model.LanguageModel`):
a trained run folder, a Hugging Face causal-LM folder (any causal family of `attnlab.families`) or a
GGUF file, with its tokenizer and the context it reads.

What `attnlab eval FOLDER|RUN --data FILE` and lm-evaluation-harness's `attnlab` model load. It
sits with the studies because every source is loaded through `attnlab.train.load.load_any` (the
layer below: `attnlab.tasks.sources.load_checkpoint` with the run loader of `attnlab.load`); what
is loaded is evaluated in `attnlab.eval`.
"""

from pathlib import Path

import torch

from attnlab.errors import UserError
from attnlab.eval.language_model import LanguageModel
from attnlab.families import CAUSAL_LM
from attnlab.sources import takes_words


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
