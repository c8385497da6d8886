"""Chat templates below the tasks: a folder's Jinja template read from its files and rendered in
the sandbox `transformers`' `apply_chat_template` uses, with the spans of `{% generation %}` blocks
(the assistant's text, where a template marks it) found as `transformers` finds them.

Training on conversations (`attnlab.tasks.chat`) renders with the template a model will be served
with, so the rendering lives here, under the tasks; `attnlab.serve.chat_template` is the serving
side (a template's end-of-turn tokens, token ids for a request).

References: transformers' chat templating guide ("Templates for chat models", "Training with chat
templates": `return_assistant_tokens_mask` and `{% generation %}`); Jinja's sandbox documentation.
"""

import functools
import json
import re
from collections.abc import Mapping, Sequence
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
