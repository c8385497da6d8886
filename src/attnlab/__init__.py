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

A conversation with a chat model, its calculator calls answered while it generates (`attnlab chat`):
chat = attnlab.Chat("runs/chat-sft", system="Be brief.")   # a chat run, a chat model's folder or GGUF file
print(chat.say("What is 347 * 12?"))       # 347 * 12 = 4164. (the calculator answered the call)
for piece in chat.stream("And 12 * 12?"):  # the reply as it comes; a ToolResult for each call
    print(piece, end="")
chat.messages     # the history, the call and the tool's answer included (OpenAI's chat shape)
chat.reset()      # forget it
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
    if name == "Chat":  # attnlab.chat imports no PyTorch either; a Chat does, when it is made
        return import_module("attnlab.chat").Chat
    raise AttributeError(f"module 'attnlab' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *SUBPACKAGES, "Chat"})


__all__ = ["Chat", "CheckpointError", "ConfigError", "ExportError", "UserError", "__version__", "load"]
