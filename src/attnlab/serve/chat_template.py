"""A Hugging Face folder's chat template: read from its files, rendered as `transformers` renders it.

A chat model's folder says how a conversation becomes text in a Jinja template (`chat_template` in
`tokenizer_config.json`, or the file `chat_template.jinja` beside it, which `transformers` prefers).
The template is code from the checkpoint's authors, so it runs in Jinja's immutable sandbox with
exactly what `transformers`' `apply_chat_template` gives it (transformers/utils/chat_template_utils.py):
`trim_blocks` and `lstrip_blocks`, the `loopcontrols` extension, `raise_exception`, a `tojson` that
keeps non-ASCII text, `strftime_now`, and the variables `messages`, `add_generation_prompt`,
`tools`, `documents` and the named special tokens (`bos_token`, `eos_token`, ...). The rendered
text is tokenized without the tokenizer's own additions: the template writes `bos_token` itself
where it wants one. Same template, same messages: the same token ids as `apply_chat_template`.

References: transformers' chat templating guide ("Templates for chat models"); Jinja's sandbox
documentation (`ImmutableSandboxedEnvironment`).
"""

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnlab.data.chat_templates import TemplateRenderError, compile_template, read_json, read_template, render

GENERATION_CONFIG = "generation_config.json"
ChatTemplateError = TemplateRenderError
"""The template refused the messages (`raise_exception`) or failed on them; the message says why."""
__all__ = ["ChatTemplate", "ChatTemplateError", "compile_template", "read_chat_template"]


@dataclass(frozen=True)
class ChatTemplate:
    """A chat template and the special tokens it may name.

    source: the Jinja text. special_tokens: `bos_token` etc. as text, those the folder names.
    end_of_turn: the texts of the tokens that end a reply (generation_config.json's and
    tokenizer_config.json's eos tokens): a reply stops at the first.
    """

    source: str
    special_tokens: Mapping[str, str] = field(default_factory=dict)
    end_of_turn: tuple[str, ...] = ()

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> str:
        """The conversation as the model reads it. `tools`: the functions the model may call, as
        OpenAI's request writes them (`{"type": "function", "function": {...}}`), which is what
        transformers passes a template; None: no tools. Raises `ChatTemplateError` when the
        template refuses the messages or fails on them (a missing key, a type it did not expect)."""
        return render(
            self.source, messages, self.special_tokens, add_generation_prompt=add_generation_prompt, tools=tools
        )

    def encode(
        self,
        tokenizer,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> list[int]:
        """The token ids of the rendered conversation: `tokenizer` (a `BPETokenizer`) reads the
        template's special tokens as such but adds none of its own (Llama's "<s>": the template
        writes `bos_token` where it wants one), as `apply_chat_template` tokenizes."""
        text = self.render(messages, add_generation_prompt=add_generation_prompt, tools=tools)
        return tokenizer.tokenizer.encode(text, add_special_tokens=False).ids


def read_chat_template(folder: str | Path, decode: Callable[[list[int]], str]) -> ChatTemplate | None:
    """The chat template of a Hugging Face folder, or None when it has none. `decode`: the folder's
    tokenizer's (ids -> text), for the texts of the end-of-turn ids. Raises `CheckpointError` for a
    file that is not JSON, a template that is not Jinja, or several named templates none of which
    is "default"."""
    folder = Path(folder)
    found = read_template(folder)
    if found is None:
        return None
    source, special = found
    return ChatTemplate(source, special, end_of_turn=_end_of_turn(folder, special, decode))


def _end_of_turn(folder: Path, special: Mapping[str, str], decode: Callable[[list[int]], str]) -> tuple[str, ...]:
    """The texts that end a reply: tokenizer_config.json's eos token and the tokens of
    generation_config.json's `eos_token_id` (Llama 3 ends a turn with <|eot_id|>, not its eos)."""
    texts = [special["eos_token"]] if special.get("eos_token") else []
    ids = read_json(folder / GENERATION_CONFIG).get("eos_token_id")
    texts += [decode([i]) for i in (ids if isinstance(ids, list) else [ids]) if type(i) is int and i >= 0]
    return tuple(dict.fromkeys(t for t in texts if t.strip()))
