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

A chat model's reply, its calculator calls answered while it generates (`attnlab chat --tools`):
from attnlab.cli.chat import chat_template
from attnlab.decode.tool_use import TOOLS, ToolResult, reply_with_tools
from attnlab.train.load import load_any
chat = load_any("runs/chat-sft", command="chat")     # a chat run, a chat model's folder or GGUF file
messages = [{"role": "user", "content": "What is 347 * 12?"}]
for item in reply_with_tools(chat.model, chat.tokenizer, chat_template("runs/chat-sft", chat), messages,
                             200, greedy_picker(), tools=TOOLS):
    print(item.summary() if isinstance(item, ToolResult) else item)   # 347 * 12 = 4164, then the text
# messages now holds the call, the tool's answer and the final answer (OpenAI's chat shape)
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
