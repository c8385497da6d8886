"""Tool calls in chat: `tools`, `tool_choice`, `parallel_tool_calls`, the assistant's `tool_calls`
and the `tool` messages that answer them.

The functions and the conversation go to the model's chat template as transformers'
`apply_chat_template(messages, tools=...)` passes them (a call's `arguments` as a dict: the
templates write them with `tojson`). The template also says how the model writes a call, and
the reply is read back in that format, chosen from the template's text:

- Hermes (Qwen2.5, Qwen3, Hermes): `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`,
  one block a call, after any text;
- Llama 3.1/3.2: the whole reply a JSON `{"name": ..., "parameters": {...}}`, plain or after
  `<|python_tag|>` (several joined by ";");
- Mistral: `[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]` after any text.

A reply whose calls do not parse (malformed JSON, no name, arguments that are no object) is plain
content, as vLLM's parsers leave it. Streamed, the text before a call goes out as content while it
comes; a call goes out as OpenAI streams one: a first delta with its index, id, type and name, then
its arguments' text in pieces (`ToolStream`). `tool_choice` "required" or a named function
constrains the reply to the format's calls (llguidance: a Lark grammar of the format's wrapper
around `%json` of {"name": const, arguments: the function's parameters}, `structured`'s
machinery); "auto" lets the model choose and parses what it wrote; "none" renders the tools but
reads the reply as text.
"""

import json
import re
import secrets
import string
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from attnlab.serve.errors import APIError
from attnlab.serve.schemas import ChatCompletionRequest, ChatMessage, FunctionCall, ToolCall

PARAM = "tools"


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


def format_of(template: str) -> ToolFormat | None:
    """The call format a chat template's text teaches, or None when it teaches none of these."""
    if "<tool_call>" in template:
        return HERMES
    if "[TOOL_CALLS]" in template:
        return MISTRAL
    if '"parameters": ' in template and ("<|python_tag|>" in template or "ipython" in template):
        return LLAMA3
    return None


# -- the request -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ToolUse:
    """What a chat request asks of tools: the format its reply is read in (None: plain text), and
    the functions a forced reply may call (empty: the model chooses)."""

    format: ToolFormat | None
    forced: tuple = ()  # the FunctionDefinitions a "required" or named choice allows
    parallel: bool = True


def tool_use(served, body: ChatCompletionRequest) -> ToolUse:
    """The request's tools, checked: a 400 naming the field for a tool_choice without tools or
    naming no tool, two tools of one name, a parameters schema that is not JSON Schema, or a model
    whose template teaches no call format."""
    from attnlab.serve.structured import check_schema

    choice = body.tool_choice
    if not body.tools:
        if choice not in (None, "none", "auto"):
            raise APIError(400, "tool_choice: needs tools to choose from", param="tool_choice")
        return ToolUse(None)
    names = [t.function.name for t in body.tools]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise APIError(
                400, f"tools[{i}].function.name: {name!r} names two tools", param=f"tools[{i}].function.name"
            )
    for i, tool in enumerate(body.tools):
        if tool.function.parameters is not None:
            check_schema(tool.function.parameters, f"tools[{i}].function.parameters")
    fmt = format_of(served.chat.source)
    if fmt is None:
        raise APIError(
            400,
            f"tools: the chat template of model {served.name!r} teaches no tool-call format this server reads "
            '(<tool_call> blocks, a JSON call with "parameters", [TOOL_CALLS])',
            param=PARAM,
        )
    if choice == "none":
        return ToolUse(None)
    if body.response_format is not None and body.response_format.type != "text" and choice not in (None, "auto"):
        raise APIError(400, "tool_choice: a forced call cannot also follow response_format", param="tool_choice")
    parallel = body.parallel_tool_calls is not False
    if choice == "required":
        return ToolUse(fmt, tuple(t.function for t in body.tools), parallel)
    if choice is not None and choice != "auto":
        if choice.function.name not in names:
            raise APIError(
                400,
                f"tool_choice.function.name: no tool {choice.function.name!r} in tools ({', '.join(names)})",
                param="tool_choice.function.name",
            )
        return ToolUse(fmt, (body.tools[names.index(choice.function.name)].function,), parallel=False)
    return ToolUse(fmt, (), parallel)


def template_tools(body: ChatCompletionRequest) -> list[dict] | None:
    """The tools as the chat template gets them (OpenAI's shape, unset fields left out)."""
    if not body.tools:
        return None
    return [t.model_dump(exclude_none=True) for t in body.tools]


def template_message(messages: list[ChatMessage], i: int, text: str) -> dict:
    """Message `i` as the chat template gets it, `text` its content: a call's arguments as a dict,
    as transformers' templates expect; a 400 naming the field for content missing where it is
    needed, calls outside an assistant's turn, arguments that are no JSON object, or a tool
    message that answers no earlier call."""
    message = messages[i]
    where = f"messages[{i}]"
    if message.content is None and not (message.role == "assistant" and message.tool_calls):
        raise APIError(
            400,
            f"{where}.content: required (only an assistant's turn with tool_calls may leave it out)",
            param=f"{where}.content",
        )
    out = {"role": message.role, "content": None if message.content is None else text, "name": message.name}
    if message.tool_calls:
        if message.role != "assistant":
            raise APIError(
                400, f"{where}.tool_calls: only an assistant's turn calls tools", param=f"{where}.tool_calls"
            )
        out["tool_calls"] = [
            _call_for_template(call, f"{where}.tool_calls[{j}]") for j, call in enumerate(message.tool_calls)
        ]
    if message.role == "tool":
        out["tool_call_id"] = _answered(messages, i)
    return out


def _call_for_template(call: ToolCall, where: str) -> dict:
    param = f"{where}.function.arguments"
    try:
        arguments = json.loads(call.function.arguments)
    except ValueError as e:
        raise APIError(400, f"{param}: not JSON ({e})", param=param) from None
    if not isinstance(arguments, dict):
        raise APIError(400, f"{param}: must be a JSON object", param=param)
    return {"id": call.id, "type": "function", "function": {"name": call.function.name, "arguments": arguments}}


def _answered(messages: list[ChatMessage], i: int) -> str:
    """The id of the call tool message `i` answers, which an earlier assistant turn made."""
    param = f"messages[{i}].tool_call_id"
    wanted = messages[i].tool_call_id
    if wanted is None:
        raise APIError(400, f"{param}: required in a tool message (the id of the call it answers)", param=param)
    made = {c.id for m in messages[:i] if m.role == "assistant" for c in m.tool_calls or ()}
    if wanted not in made:
        raise APIError(400, f"{param}: no earlier assistant turn made a call with id {wanted!r}", param=param)
    return wanted


# -- the forced reply ----------------------------------------------------------------------------


def forced_grammar(use: ToolUse) -> str:
    """The Lark grammar (llguidance's dialect) of a reply that is only calls of `use.forced`: the
    format's wrapper around JSON objects {"name": one of them, key: its parameters}, written with
    `json.dumps`'s separators as `structured` writes JSON."""
    from attnlab.serve.structured import COMPILE_OPTIONS

    fmt = use.format
    branches = [
        {
            "type": "object",
            "properties": {"name": {"const": f.name}, fmt.key: f.parameters or {"type": "object", "maxProperties": 0}},
            "required": ["name", fmt.key],
            "additionalProperties": False,
        }
        for f in use.forced
    ]
    call = {"anyOf": branches, "x-guidance": COMPILE_OPTIONS}
    body = f"call ({json.dumps(fmt.joining)} call)*" if use.parallel else "call"
    parts = [json.dumps(fmt.opening) if fmt.opening else "", body, json.dumps(fmt.closing) if fmt.closing else ""]
    return f"start: {' '.join(p for p in parts if p)}\ncall: %json {json.dumps(call)}\n"


def forced_masks(served, use: ToolUse) -> Callable | None:
    """Each choice's grammar mask for a forced call (None when the model chooses); a 400 naming
    tools when llguidance cannot compile it. Call from a worker thread (it compiles)."""
    from llguidance import LLMatcher

    from attnlab.serve.structured import GrammarMask, compile_grammar

    if use.format is None or not use.forced:
        return None
    grammar = LLMatcher.grammar_from_lark(forced_grammar(use))
    matcher = compile_grammar(grammar, served.run.tokenizer, PARAM)
    return lambda choice: GrammarMask(matcher.deep_copy())


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


def parse(text: str, fmt: ToolFormat) -> tuple[str | None, list[ToolCall]]:
    """A whole reply's content (None when it is only calls) and calls; a reply whose calls do not
    parse is all content, without calls."""
    found = split(text, fmt, final=True)
    if found.start is None or not found.valid:
        return text, []
    content = text[: found.start].strip() or None
    calls = [ToolCall(id=fmt.call_id(), function=FunctionCall(name=n, arguments=a)) for n, a, _ in found.calls]
    return content, calls


class ToolStream:
    """One streamed choice's deltas: its content while no call has begun (a possible call's first
    characters held back), then each call as OpenAI streams it (index, id, type and name first,
    then the arguments' text).

    incremental: the arguments go out in pieces as they come, for a reply the grammar forces to be
    calls (only a reply cut by max_tokens leaves a call unfinished). Otherwise (the model chose)
    the calls go out once the reply is whole and they parse: until then nothing says that the
    reply is no plain text, and a call already sent cannot be taken back."""

    def __init__(self, fmt: ToolFormat, incremental: bool = False) -> None:
        self.fmt, self.incremental = fmt, incremental
        self.text = ""
        self.content_sent = 0  # characters of content sent
        self.sent: list[list] = []  # per call: [id, name, arguments' characters sent]

    @property
    def called(self) -> bool:
        return bool(self.sent)

    def feed(self, piece: str) -> list[dict]:
        self.text += piece
        return self._deltas(final=False)

    def finish(self) -> list[dict]:
        """The deltas left once the reply is whole: the rest of its calls, or (where the calls did
        not parse) the rest of its text as content."""
        return self._deltas(final=True)

    def _deltas(self, final: bool) -> list[dict]:
        found = split(self.text, self.fmt, final)
        if final and not found.valid:  # no call after all: what is left is content
            return self._content(len(self.text))
        if found.start is None:
            return self._content(len(self.text) if final else len(self.text) - self._held())
        out = self._content(found.start)
        if not (final or self.incremental):
            return out
        for i, (name, arguments, _) in enumerate(found.calls):
            if name is None:
                break
            if i == len(self.sent):
                self.sent.append([self.fmt.call_id(), name, 0])
                function = {"name": name, "arguments": ""}
                out.append(
                    {"tool_calls": [{"index": i, "id": self.sent[i][0], "type": "function", "function": function}]}
                )
            if len(arguments) > self.sent[i][2]:
                new = arguments[self.sent[i][2] :]
                self.sent[i][2] = len(arguments)
                out.append({"tool_calls": [{"index": i, "function": {"arguments": new}}]})
        return out

    def _content(self, end: int) -> list[dict]:
        if end <= self.content_sent or self.sent:
            return []
        text, self.content_sent = self.text[self.content_sent : end], end
        return [{"content": text}]

    def _held(self) -> int:
        """How many characters at the end might begin a call."""
        if self.fmt.bare and not self.text.strip():
            return len(self.text)
        tail = self.text[self.content_sent :]
        return next(
            (k for k in range(min(len(tail), len(self.fmt.start)), 0, -1) if self.fmt.start.startswith(tail[-k:])), 0
        )
