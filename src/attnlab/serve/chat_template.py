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

import functools
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from attnlab.errors import CheckpointError

TOKENIZER_CONFIG = "tokenizer_config.json"
TEMPLATE_FILE = "chat_template.jinja"
GENERATION_CONFIG = "generation_config.json"
# The named special tokens transformers passes to every template (SPECIAL_TOKENS_ATTRIBUTES).
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


class ChatTemplateError(ValueError):
    """The template refused the messages (`raise_exception`) or failed on them; the message says why."""


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
        # As transformers: keys whose value is None are dropped (templates test `'key' in message`).
        plain = [{k: v for k, v in dict(m).items() if v is not None} for m in messages]
        try:
            return compile_template(self.source).render(
                messages=plain,
                tools=None if tools is None else [dict(t) for t in tools],
                documents=None,
                add_generation_prompt=add_generation_prompt,
                **self.special_tokens,
            )
        except jinja2.TemplateError as e:  # raise_exception(...), an undefined name, the sandbox
            raise ChatTemplateError(str(e)) from None
        except (TypeError, ValueError, KeyError, IndexError, AttributeError) as e:
            raise ChatTemplateError(f"{type(e).__name__}: {e}") from None

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


class GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` renders its body: transformers uses the tag to mark
    the assistant's tokens for training masks, which serving does not need."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body).set_lineno(lineno)


def _raise_exception(message: str):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # Jinja's own tojson escapes HTML characters (<, >, &), which a prompt must keep.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


class _Namespace(jinja2.utils.Namespace):
    """Jinja's `namespace()` without underscore-prefixed names, as transformers has it: a template
    must not reach Python's internals through one."""

    def __init__(*args, **kwargs) -> None:
        self, args = args[0], args[1:]  # Jinja's own signature trick: `namespace(self=...)` still works
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name, value) -> None:
        _check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)


def _check_name(name) -> None:
    if isinstance(name, str) and name.startswith("_"):
        raise jinja2.exceptions.SecurityError(f"a chat template cannot set {name!r} on a namespace")


@functools.lru_cache(maxsize=16)
def compile_template(source: str) -> jinja2.Template:
    """The Jinja template of `source` in transformers' sandboxed environment (compiled once)."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols, GenerationTag]
    )
    env.filters["tojson"] = _tojson
    # `dict` as a plain function: the type itself would let a template reach its class attributes.
    env.globals.update(
        raise_exception=_raise_exception,
        strftime_now=_strftime_now,
        namespace=_Namespace,
        dict=lambda *a, **k: dict(*a, **k),
    )
    return env.from_string(source)


def read_chat_template(folder: str | Path, decode: Callable[[list[int]], str]) -> ChatTemplate | None:
    """The chat template of a Hugging Face folder, or None when it has none. `decode`: the folder's
    tokenizer's (ids -> text), for the texts of the end-of-turn ids. Raises `CheckpointError` for a
    file that is not JSON, a template that is not Jinja, or several named templates none of which
    is "default"."""
    folder = Path(folder)
    config = _read_json(folder / TOKENIZER_CONFIG)
    if (folder / TEMPLATE_FILE).is_file():  # transformers prefers the file to the config's entry
        source = (folder / TEMPLATE_FILE).read_text(encoding="utf-8")
    else:
        source = _config_template(config.get("chat_template"), folder / TOKENIZER_CONFIG)
    if source is None:
        return None
    special = {k: _token_text(config[k]) for k in SPECIAL_TOKENS if config.get(k) is not None}
    try:
        compile_template(source)
    except jinja2.TemplateSyntaxError as e:
        raise CheckpointError(f"the chat template of {folder} is not a Jinja template: {e}") from None
    return ChatTemplate(source, special, end_of_turn=_end_of_turn(folder, special, decode))


def _read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path} is not JSON ({e})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} must hold a JSON object")
    return data


def _config_template(value: Any, path: Path) -> str | None:
    """tokenizer_config.json's `chat_template`: a string, or a list of {"name", "template"} of
    which transformers uses "default"."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(t, dict) and {"name", "template"} <= set(t) for t in value):
        named = {t["name"]: t["template"] for t in value}
        if "default" in named:
            return named["default"]
        raise CheckpointError(f"{path}: chat templates {sorted(named)} but none named 'default'")
    raise CheckpointError(f"{path}: chat_template must be a string or a list of named templates")


def _token_text(value: Any) -> str:
    """A special token as tokenizer_config.json writes it: "<s>", or an AddedToken {"content": "<s>", ...}."""
    return value["content"] if isinstance(value, dict) and "content" in value else str(value)


def _end_of_turn(folder: Path, special: Mapping[str, str], decode: Callable[[list[int]], str]) -> tuple[str, ...]:
    """The texts that end a reply: tokenizer_config.json's eos token and the tokens of
    generation_config.json's `eos_token_id` (Llama 3 ends a turn with <|eot_id|>, not its eos)."""
    texts = [special["eos_token"]] if special.get("eos_token") else []
    ids = _read_json(folder / GENERATION_CONFIG).get("eos_token_id")
    texts += [decode([i]) for i in (ids if isinstance(ids, list) else [ids]) if type(i) is int and i >= 0]
    return tuple(dict.fromkeys(t for t in texts if t.strip()))
