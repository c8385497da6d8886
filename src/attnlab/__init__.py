"""attnlab: the Transformer family, readable and measured.

import attnlab
run = attnlab.load("runs/demo")      # .model, .tokenizer, .config
maps = attnlab.viz.attention_maps(run, "ROMEO:")   # subpackages load on first use

Speculative decoding (the same text as without it, sooner): a smaller run with the same tokenizer
drafts, or prompt lookup copies from the context.
from attnlab.decode import ModelDrafter, PromptLookup, Speculation, complete, greedy_picker
draft = attnlab.load("runs/small")
spec = Speculation(ModelDrafter(draft.model), k=4)   # or Speculation(PromptLookup(max_ngram=3), k=8)
text = complete(run.model, run.tokenizer, "ROMEO:", 200, greedy_picker(), speculation=spec)
print(spec.stats.summary())   # accepted tokens per step
"""

from importlib import import_module
from pathlib import Path

from attnlab.errors import CheckpointError, ConfigError, ExportError, UserError

__version__ = "0.1.0"


def load(path: str | Path, *, device: str = "cpu", checkpoint: str = "best", merge_lora: bool = True):
    """A trained run folder -> a `Run` with `.model` (eval mode), `.tokenizer`, `.config`.

    checkpoint: "best" (best validation score; the last checkpoint when the run has no best) or "last".
    merge_lora: a LoRA run's adapters merged into its base's weights, or kept as `LoRALinear` layers.
    Any other path is refused in the words every command uses (`attnlab.sources.refusal`); a
    Hugging Face folder or a GGUF file loads with `attnlab.train.load.load_any(path, command=...)`.
    """
    from attnlab.train.load import load_run

    return load_run(path, device=device, checkpoint=checkpoint, merge_lora=merge_lora)


# Importing `attnlab` stays cheap (the CLI starts with it); each subpackage is imported the first
# time it is named, so `attnlab.viz.attention_maps(...)` works after a bare `import attnlab`.
SUBPACKAGES = ("data", "decode", "eval", "models", "nn", "tasks", "train", "viz")


def __getattr__(name: str):
    if name in SUBPACKAGES:
        return import_module(f"attnlab.{name}")
    raise AttributeError(f"module 'attnlab' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *SUBPACKAGES})


__all__ = ["CheckpointError", "ConfigError", "ExportError", "UserError", "__version__", "load"]
