"""Tool calls in chat: `tools`, `tool_choice`, `parallel_tool_calls`, the assistant's `tool_calls`
and the `tool` messages that answer them.

The functions and the conversation go to the model's chat template as transformers'
`apply_chat_template(messages, tools=...)` passes them (a call's `arguments` as a dict: the
templates write them with `tojson`). The template also says how the model writes a call, and
the reply is read back in that format, chosen from the template's text (Hermes' `<tool_call>`
blocks, Llama 3's JSON with "parameters", Mistral's `[TOOL_CALLS]`: `attnlab.decode.tool_calls`,
where the reading lives so that the decoders' tool loop reads calls as the server does).

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
from collections.abc import Callable
from dataclasses import dataclass

# The formats and their reading live below the decoders (the CLI's and the API's tool loop read
# calls too); they are named here as well, where the server's code and tests have always found them.
from attnlab.decode.tool_calls import (  # noqa: F401
    HERMES,
    LLAMA3,
    MISTRAL,
    MISTRAL_NEMO,
    Split,
    ToolFormat,
    call_prefix,
    format_of,
    split,
    template_content,
)
from attnlab.serve.errors import APIError
from attnlab.serve.schemas import ChatCompletionRequest, ChatMessage, FunctionCall, ToolCall

PARAM = "tools"


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
    as transformers' templates expect, and a call turn's missing content "" (`template_content`);
    a 400 naming the field for content missing where it is needed, calls outside an assistant's
    turn, arguments that are no JSON object, or a tool message that answers no earlier call."""
    message = messages[i]
    where = f"messages[{i}]"
    if message.content is None and not (message.role == "assistant" and message.tool_calls):
        raise APIError(
            400,
            f"{where}.content: required (only an assistant's turn with tool_calls may leave it out)",
            param=f"{where}.content",
        )
    content = template_content(None if message.content is None else text, bool(message.tool_calls))
    out = {"role": message.role, "content": content, "name": message.name}
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
        return call_prefix(self.text[self.content_sent :], self.fmt)
