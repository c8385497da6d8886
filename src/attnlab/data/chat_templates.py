"""Chat templates below the tasks: a folder's Jinja template read from its files and rendered in
the sandbox `transformers`' `apply_chat_template` uses, with the spans of `{% generation %}` blocks
(the assistant's text, where a template marks it) found as `transformers` finds them.

Training on conversations (`attnlab.tasks.chat`) renders with the template a model will be served
with, so the rendering lives here, under the tasks, with the template object every face uses
(`ChatTemplate`: its end-of-turn tokens, token ids for a conversation), read from a folder
(`read_chat_template`) or from the template a checkpoint carries (`carried_chat_template`).
`attnlab.serve.chat_template` re-exports it for the server.

References: transformers' chat templating guide ("Templates for chat models", "Training with chat
templates": `return_assistant_tokens_mask` and `{% generation %}`); Jinja's sandbox documentation.
"""

import functools
import json
import re
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
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
"""The named special tokens transformers passes to every template (SPECIAL_TOKENS_ATTRIBUTES)."""

# Private-use characters around a {% generation %} block's output while marking: stripped before
# the text is tokenized, their places kept as the block's character span.
OPEN, CLOSE = "\ue000", "\ue001"
GENERATION = re.compile(r"{%-?\s*generation\s*-?%}")


class TemplateRenderError(ValueError):
    """The template refused the messages (`raise_exception`) or failed on them; the message says why."""


class GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}`: the body rendered as it is."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return [node.set_lineno(lineno) for node in self._wrap(body)]

    def _wrap(self, body) -> list:
        return [jinja2.nodes.Scope(body)]


class MarkedGenerationTag(GenerationTag):
    """`{% generation %}` whose output is framed by OPEN and CLOSE, so its span can be found."""

    def _wrap(self, body) -> list:
        mark = [jinja2.nodes.Output([jinja2.nodes.TemplateData(m)]) for m in (OPEN, CLOSE)]
        return [mark[0], jinja2.nodes.Scope(body), mark[1]]


def _raise_exception(message: str):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # Jinja's own tojson escapes HTML characters (<, >, &), which a prompt must keep.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class _Namespace(jinja2.utils.Namespace):
    """Jinja's `namespace()` without underscore-prefixed names, as transformers has it."""

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


@functools.lru_cache(maxsize=32)
def compile_template(source: str, *, mark_generation: bool = False) -> jinja2.Template:
    """The Jinja template of `source` in transformers' sandboxed environment (compiled once); with
    `mark_generation`, `{% generation %}` blocks come out framed by OPEN and CLOSE."""
    tag = MarkedGenerationTag if mark_generation else GenerationTag
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols, tag])
    env.filters["tojson"] = _tojson
    # `dict` as a plain function: the type itself would let a template reach its class attributes.
    env.globals.update(
        raise_exception=_raise_exception,
        strftime_now=lambda format: datetime.now().strftime(format),
        namespace=_Namespace,
        dict=lambda *a, **k: dict(*a, **k),
    )
    return env.from_string(source)


def render(
    source: str,
    messages: Sequence[Mapping[str, Any]],
    special_tokens: Mapping[str, str],
    *,
    add_generation_prompt: bool,
    mark_generation: bool = False,
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> str:
    """The conversation as the template writes it. `tools`: the functions the model may call, as
    OpenAI's request writes them (`{"type": "function", "function": {...}}`), which is what
    transformers passes a template; None: no tools. A `TemplateRenderError` where the template
    refuses the messages or fails on them (a missing key, a type it did not expect)."""
    plain = [{k: v for k, v in dict(m).items() if v is not None} for m in messages]  # as transformers
    try:
        template = compile_template(source, mark_generation=mark_generation)
        return template.render(
            messages=plain,
            tools=None if tools is None else [dict(t) for t in tools],
            documents=None,
            add_generation_prompt=add_generation_prompt,
            **special_tokens,
        )
    except jinja2.TemplateError as e:  # raise_exception(...), an undefined name, the sandbox
        raise TemplateRenderError(str(e)) from None
    except (TypeError, ValueError, KeyError, IndexError, AttributeError) as e:
        raise TemplateRenderError(f"{type(e).__name__}: {e}") from None


def generation_spans(marked: str) -> tuple[str, list[tuple[int, int]]]:
    """A text rendered with `mark_generation` -> (the text without the marks, the character spans
    `[start, end)` of its generation blocks). Example: "a\ue000bc\ue001d" -> ("abcd", [(1, 3)])."""
    text, spans, start = [], [], None
    length = 0
    for piece in re.split(f"([{OPEN}{CLOSE}])", marked):
        if piece == OPEN:
            start = length
        elif piece == CLOSE:
            spans.append((start, length))
        else:
            text.append(piece)
            length += len(piece)
    return "".join(text), spans


def has_generation_blocks(source: str) -> bool:
    return GENERATION.search(source) is not None


def read_template(folder: str | Path) -> tuple[str, dict[str, str]] | None:
    """(template source, named special tokens) of a Hugging Face folder, or None when it has no
    template: `chat_template.jinja` (which transformers prefers), else tokenizer_config.json's
    `chat_template` (a string, or named templates of which "default"). A `CheckpointError` for a
    file that is not JSON or a template that is not Jinja."""
    folder = Path(folder)
    config = read_json(folder / TOKENIZER_CONFIG)
    if (folder / TEMPLATE_FILE).is_file():
        source = (folder / TEMPLATE_FILE).read_text(encoding="utf-8")
    else:
        source = _config_template(config.get("chat_template"), folder / TOKENIZER_CONFIG)
    if source is None:
        return None
    try:
        compile_template(source)
    except jinja2.TemplateSyntaxError as e:
        raise CheckpointError(f"the chat template of {folder} is not a Jinja template: {e}") from None
    special = {k: _token_text(config[k]) for k in SPECIAL_TOKENS if config.get(k) is not None}
    return source, special


def read_json(path: Path) -> dict:
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
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(t, dict) and {"name", "template"} <= set(t) for t in value):
        named = {t["name"]: t["template"] for t in value}
        if "default" in named:
            return named["default"]
        raise CheckpointError(f"{path}: chat templates {sorted(named)} but none named 'default'")
    raise CheckpointError(f"{path}: chat_template must be a string or a list of named templates")


def _token_text(value: Any) -> str:
    """A special token as tokenizer_config.json writes it: "<s>", or {"content": "<s>", ...}."""
    return value["content"] if isinstance(value, dict) and "content" in value else str(value)


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
        transformers passes a template; None: no tools. Raises `TemplateRenderError` when the
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


def carried_chat_template(source: str, tokenizer) -> ChatTemplate:
    """A `ChatTemplate` of a template carried in the checkpoint (a chat run's, a GGUF file's), with
    the tokenizer's (a `BPETokenizer`'s) beginning and end tokens as the special tokens it may name;
    a reply ends at the end token. A `CheckpointError` for a template that is not Jinja."""
    ids = {"bos_token": tokenizer.bos_id, "eos_token": tokenizer.eos_id}
    special = {k: tokenizer.tokenizer.id_to_token(i) for k, i in ids.items() if i is not None}
    try:
        compile_template(source)
    except jinja2.TemplateSyntaxError as e:
        raise CheckpointError(f"the chat template the checkpoint carries is not a Jinja template: {e}") from None
    end = (special["eos_token"],) if special.get("eos_token") else ()
    return ChatTemplate(source, special, end_of_turn=end)
