"""How chat templates teach a model to write tool calls, and reading the calls back out of a reply.

The format is chosen from the template's text:

- Hermes (Qwen2.5, Qwen3, Hermes, attnlab's own template):
  `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, one block a call, after any text;
- Llama 3.1/3.2: the whole reply a JSON `{"name": ..., "parameters": {...}}`, plain or after
  `<|python_tag|>` (several joined by ";");
- Mistral: `[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]` after any text (Mistral
  7B v0.3; Nemo's template, for the Tekken tokenizer, writes it without the space:
  `[TOOL_CALLS][...]`).

A reply whose calls do not parse (malformed JSON, no name, arguments that are no object) is plain
content, as vLLM's parsers leave it. This is the text-only part, below the decoders: the server
(`attnlab.serve.tools`) turns the calls into OpenAI's `tool_calls`, and the decoders' tool loop
(`attnlab.decode.tool_use`) answers them while a reply is generated.
"""

import json
import re
import secrets
import string
import uuid
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ToolFormat:
    """How a family's template teaches the model to write calls.

    start: the text that opens the calls; bare: a reply may also start with the call's JSON itself
    (Llama 3); key: the arguments' key; between: what may stand around and between the calls'
    JSON objects; opening, joining, closing: what a forced reply writes before, between and after
    them; mistral_ids: ids of 9 letters and digits (Mistral's template refuses others).
    """

    name: str
    start: str
    key: str
    between: re.Pattern
    opening: str
    joining: str
    closing: str
    bare: bool = False
    mistral_ids: bool = False

    def call_id(self) -> str:
        if self.mistral_ids:
            return "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(9))
        return f"call_{uuid.uuid4().hex[:24]}"


HERMES = ToolFormat(
    "hermes",
    "<tool_call>",
    "arguments",
    re.compile(r"(?:\s|</?tool_call>)*"),
    "<tool_call>\n",
    "\n</tool_call>\n<tool_call>\n",
    "\n</tool_call>",
)
LLAMA3 = ToolFormat(
    "llama3", "<|python_tag|>", "parameters", re.compile(r"(?:\s|;|<\|python_tag\|>)*"), "", "; ", "", bare=True
)
MISTRAL = ToolFormat(
    "mistral",
    "[TOOL_CALLS]",
    "arguments",
    re.compile(r"(?:\s|,|\[TOOL_CALLS\]|\[|\])*"),
    "[TOOL_CALLS] [",
    ", ",
    "]",
    mistral_ids=True,
)
MISTRAL_NEMO = ToolFormat(  # read as MISTRAL; a forced reply opens as Nemo's template writes calls
    "mistral_nemo",
    MISTRAL.start,
    MISTRAL.key,
    MISTRAL.between,
    "[TOOL_CALLS][",
    MISTRAL.joining,
    MISTRAL.closing,
    mistral_ids=True,
)


def format_of(template: str) -> ToolFormat | None:
    """The call format a chat template's text teaches, or None when it teaches none of these."""
    if "<tool_call>" in template:
        return HERMES
    if "[TOOL_CALLS]" in template:
        return MISTRAL if "[TOOL_CALLS] [" in template else MISTRAL_NEMO
    if '"parameters": ' in template and ("<|python_tag|>" in template or "ipython" in template):
        return LLAMA3
    return None


def template_content(content: str | None, calls: bool) -> str | None:
    """A turn's content as a chat template takes it: a call turn's missing content (OpenAI's
    null) as empty text, as vLLM passes it. Qwen3's published template reads every assistant
    turn's content as a string (`'</think>' in message.content`) and fails on a turn without one;
    the other families' templates skip empty content as they skip a missing one."""
    return "" if content is None and calls else content


# -- reading calls back --------------------------------------------------------------------------

NAMED = re.compile(r'\{\s*"name"\s*:\s*"([^"\\]*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*')


@dataclass
class Split:
    """A reply cut into its content and its calls. start: where the calls begin (None: no call
    yet); calls: (name or None, the arguments' text so far, complete) each; valid: whether the
    whole reply parses as content and calls."""

    start: int | None
    calls: list[tuple[str | None, str, bool]] = field(default_factory=list)
    valid: bool = True


def split(text: str, fmt: ToolFormat, final: bool) -> Split:
    """The calls in `text` so far (`final`: the whole reply; else a prefix of it, whose last call
    may be unfinished)."""
    start = _calls_start(text, fmt)
    if start is None:
        return Split(None)
    body, pos, calls, valid = text[start:], 0, [], True
    while (begin := body.find("{", pos)) >= 0:
        valid &= bool(fmt.between.fullmatch(body[pos:begin]))
        end = _value_end(body, begin)
        calls.append(_call(body[begin:end] if end else body[begin:], fmt, complete=end is not None))
        if end is None:
            return Split(start, calls, valid and not final)
        pos = end
    valid &= bool(calls) and bool(fmt.between.fullmatch(body[pos:])) and all(c[0] is not None for c in calls)
    return Split(start, calls, valid)


def _calls_start(text: str, fmt: ToolFormat) -> int | None:
    found = text.find(fmt.start)
    stripped = text.lstrip()
    if fmt.bare and stripped.startswith("{") and (found < 0 or found > len(text) - len(stripped)):
        return len(text) - len(stripped)
    return None if found < 0 else found


def _value_end(text: str, start: int) -> int | None:
    """Just past the JSON object or array that opens at `text[start]`; None if it does not close."""
    depth, quoted, escaped = 0, False, False
    for i in range(start, len(text)):
        c = text[i]
        if quoted:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                quoted = False
        elif c == '"':
            quoted = True
        elif c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth == 0:
                return i + 1
    return None


def _call(text: str, fmt: ToolFormat, complete: bool) -> tuple[str | None, str, bool]:
    """(name, arguments' text, complete) of one call's JSON object (or its beginning). A complete
    object that is no call (no name, arguments that are no object) has name None."""
    named = NAMED.match(text)
    arguments = ""
    if named:
        end = _value_end(text, named.end()) if text[named.end() : named.end() + 1] == "{" else None
        arguments = text[named.end() : end] if end else text[named.end() :]
    if not complete:
        return (named.group(1) if named else None), arguments, False
    try:
        found = json.loads(text)
    except ValueError:
        return None, "", True
    args = found.get(fmt.key, found.get("arguments")) if isinstance(found, dict) else None
    if not isinstance(found.get("name") if isinstance(found, dict) else None, str) or not isinstance(args, dict):
        return None, "", True
    if not named or _loads(arguments) != args:  # keys in another order: the arguments rewritten
        arguments = json.dumps(args, ensure_ascii=False)
    return found["name"], arguments, True


def _loads(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return None


def call_prefix(text: str, fmt: ToolFormat) -> int:
    """How many characters at the end of `text` might begin a call (held back while streaming)."""
    if fmt.bare and not text.strip():
        return len(text)
    return next((k for k in range(min(len(text), len(fmt.start)), 0, -1) if fmt.start.startswith(text[-k:])), 0)
