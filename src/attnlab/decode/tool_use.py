"""Tools a chat model calls while it generates a reply, nanochat's pattern: the reply is decoded;
where it ends its turn on a complete call (the chat template's format, `attnlab.decode.tool_calls`),
the call is answered by the tool (the calculator: `attnlab.decode.calculator`), the assistant's
call and the tool's answer join the conversation, and the conversation, rendered again by the
template with the assistant's turn opened, is the sequence the reply goes on from. The template
decides the exact text forced into the sequence (attnlab's: `<|im_start|>tool\\n4164<|im_end|>\\n`
then `<|im_start|>assistant\\n`), as training on such conversations taught it
(`attnlab.data.conversations`).

One KV cache serves the whole reply (`_Sequence`): the conversation is read once, each generated
token is appended, and after a call only what the rendered conversation adds past the tokens
already read (the end of the call's turn, the tool's answer, the next assistant header) is read
into the cache, as nanochat's engine forces a tool's output in. Where the template renders the
call's tokens otherwise than the model wrote them (other spacing, another tokenization), the
cache is cut back to the longest prefix the two share and the rest is read: the tokens that follow
are those a fresh prefill of the rendered conversation gives.

A call to an unknown tool, arguments that are not the tool's, or an expression the calculator
refuses is answered with "error: why", never an exception out of the reply. At most `max_calls`
calls a reply: a call past them stays the reply's text, unanswered.

References: nanochat's Engine (`<|python_start|>...<|python_end|>` evaluated and its output forced
as `<|output_start|>...<|output_end|>`); OpenAI's chat format for calls and tool messages.
"""

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from attnlab.accel import for_decoding
from attnlab.data.tokenizers import Tokenizer
from attnlab.decode.calculator import ALLOWED, calculate
from attnlab.decode.prefix_cache import reusable
from attnlab.decode.sampling import Picker, _eval_mode
from attnlab.decode.text import token_text
from attnlab.decode.tool_calls import ToolFormat, call_prefix, format_of, split, template_content
from attnlab.models.protocols import CausalDecoder

MAX_CALLS = 4


@dataclass(frozen=True)
class Tool:
    """A tool the decoders run: its OpenAI function definition (what a template shows the model)
    and its answer to a call's arguments (a JSON object), as text."""

    definition: Mapping[str, Any]
    run: Callable[[dict], str]


def _calculator(arguments: dict) -> str:
    expression = arguments.get("expression")
    if set(arguments) != {"expression"} or not isinstance(expression, str):
        return 'error: the calculator takes {"expression": "ARITHMETIC"}, one string'
    return calculate(expression)


CALCULATOR = Tool(
    {
        "name": "calculator",
        "description": f"Evaluate an arithmetic expression ({ALLOWED}).",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "the arithmetic, e.g. 347 * 12"}},
            "required": ["expression"],
            "additionalProperties": False,
        },
    },
    _calculator,
)
TOOLS: dict[str, Tool] = {"calculator": CALCULATOR}
"""The tools by name, which `attnlab chat --tools` and `attnlab serve --tools` choose from."""


@dataclass(frozen=True)
class ToolResult:
    """One call answered: its id, the tool's name, the arguments as the model wrote them (JSON
    text) and the tool's answer."""

    id: str
    name: str
    arguments: str
    content: str

    def summary(self) -> str:
        """One line: `347*12 = 4164` for the calculator, `ARGUMENTS -> ANSWER` for others."""
        try:
            expression = json.loads(self.arguments).get("expression")
        except (ValueError, AttributeError):
            expression = None
        if isinstance(expression, str):
            joint = ": " if self.content.startswith("error:") else " = "
            return f"{expression}{joint}{self.content}"
        return f"{self.arguments} -> {self.content}"


def tools_named(names: Sequence[str]) -> dict[str, Tool]:
    """The tools of `names`; a ValueError naming the tools there are for an unknown one."""
    unknown = [n for n in names if n not in TOOLS]
    if unknown:
        raise ValueError(f"no tool {unknown[0]!r}; the tools are {', '.join(TOOLS)}")
    return {n: TOOLS[n] for n in names}


def definitions(tools: Mapping[str, Tool]) -> list[dict] | None:
    """The tools as a chat template takes them (OpenAI's `tools`); None for none."""
    return [{"type": "function", "function": dict(t.definition)} for t in tools.values()] or None


def answer(name: str | None, arguments: str, tools: Mapping[str, Tool]) -> str:
    """The tool's answer to a call, or "error: why" (an unknown tool, arguments that are no JSON object)."""
    tool = tools.get(name) if name is not None else None
    if tool is None:
        return f"error: no tool {name!r}; the tools are {', '.join(tools) or 'none'}"
    try:
        parsed = json.loads(arguments)
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        return "error: a call's arguments must be a JSON object"
    return tool.run(parsed)


def answer_calls(text: str, fmt: ToolFormat, tools: Mapping[str, Tool], first: int = 1) -> tuple[list[dict], list]:
    """A finished reply `text` that ends in calls -> the messages it adds to the conversation (the
    assistant's turn with its `tool_calls`, OpenAI's shape, then a `tool` message a call) and the
    `ToolResult`s; ([], []) when it makes no call. Call ids are call_{first}, call_{first + 1}, ..."""
    found = split(text, fmt, final=True)
    if found.start is None or not found.valid:
        return [], []
    results = [
        ToolResult(f"call_{first + k}", name, arguments, answer(name, arguments, tools))
        for k, (name, arguments, _) in enumerate(found.calls)
    ]
    calls = [{"id": r.id, "type": "function", "function": {"name": r.name, "arguments": r.arguments}} for r in results]
    turn = {"role": "assistant", "content": text[: found.start].strip() or None, "tool_calls": calls}
    answers = [{"role": "tool", "tool_call_id": r.id, "content": r.content} for r in results]
    return [turn, *answers], results


def for_template(messages: Sequence[Mapping[str, Any]]) -> list[dict]:
    """The messages as chat templates take them: a call's arguments a dict, not JSON text; a call
    turn's missing content "" (`template_content`)."""
    out = []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls"):
            m["tool_calls"] = [_parsed_call(c) for c in m["tool_calls"]]
            m["content"] = template_content(m.get("content"), True)
        out.append(m)
    return out


def _parsed_call(call: Mapping[str, Any]) -> dict:
    arguments = call["function"]["arguments"]
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            pass  # the template writes what there is
    return {**call, "function": {**call["function"], "arguments": arguments}}


def reply_with_tools(
    model: CausalDecoder,
    tokenizer: Tokenizer,
    template,
    messages: list[dict],
    max_new_tokens: int,
    pick: Picker,
    *,
    tools: Mapping[str, Tool] | None = None,
    max_calls: int = MAX_CALLS,
    context: int | None = None,
) -> Iterator[str | ToolResult]:
    """The assistant's reply to `messages` (OpenAI's chat shape), streamed: its text in pieces
    (a possible call's text held back until it is one) and a `ToolResult` for each call answered.
    The messages the reply makes are appended to `messages` as they are made (the calls and the
    tools' answers, then the final assistant message, also when the caller stops early).

    template: a chat template (`attnlab.serve.chat_template.ChatTemplate`: `source`, `encode`,
    `end_of_turn`). tools: by name (default: the calculator). max_new_tokens: the reply's new
    tokens in all, across its continuations. context: the positions the conversation and the
    reply may fill (default and at most the model's block_size, the one KV cache's length): no
    continuation starts past it, and the reply stops where it is full."""
    tools = TOOLS if tools is None else tools
    fmt = format_of(template.source) if tools else None
    state = _Reply(messages)
    try:
        yield from state.generate(model, tokenizer, template, max_new_tokens, pick, fmt, tools, max_calls, context)
    finally:
        state.close()


class _Counted:
    """A picker that counts the tokens it picks (one a call: one row)."""

    def __init__(self, pick: Picker) -> None:
        self.pick, self.count = pick, 0

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        self.count += logits.size(0)
        return self.pick(logits)


class _Sequence:
    """The tokens the model has read in one reply (batch 1) and their keys and values, `capacity`
    positions of them (the context, at most the model's block_size). Reading a sequence reads only
    the tokens past the longest prefix it shares with those already read; where it parts from them,
    the cache is cut back there first (`ModelCache.truncate`; a cache that cannot be cut, a ring, is
    begun again)."""

    def __init__(self, model: CausalDecoder, context: int | None) -> None:
        for_decoding(model)
        block = model.config.block_size
        self.model, self.capacity = model, block if context is None else min(context, block)
        self.device = next(model.parameters()).device
        self.cache = model.new_cache(1, self.capacity)
        self.read_ids: list[int] = []  # the tokens whose keys and values the cache holds, in order

    def tokens(self, ids: list[int], room: int, pick: Picker, eos_id: int | None) -> Iterator[int]:
        """The next tokens after the sequence `ids` (all of it, the tokens read before included),
        at most `room`, up to and including `eos_id`; each is read into the cache before the next
        is picked (the last one is not: nothing reads its logits)."""
        logits = self._read(ids[self._keep(ids) :])
        for i in range(room):
            token = int(pick(logits)[0])
            yield token
            if token == eos_id or i == room - 1:
                return
            logits = self._read([token])

    def _keep(self, ids: list[int]) -> int:
        """Cut the cache back to the longest prefix of `ids` it holds, short of `ids`' last token
        (read again for its logits); how many tokens are kept."""
        shared, limit = 0, min(len(self.read_ids), len(ids) - 1)
        while shared < limit and self.read_ids[shared] == ids[shared]:
            shared += 1
        if shared < len(self.read_ids):
            if reusable(self.cache):
                self.cache.truncate(shared)
            else:
                self.cache, shared = self.model.new_cache(1, self.capacity), 0
            self.read_ids = self.read_ids[:shared]
        return shared

    def _read(self, ids: list[int]) -> torch.Tensor:
        """The logits `(1, V)` after `ids` appended to the cache, read `block_size` at a time (a
        ring takes no more at once)."""
        block = self.model.config.block_size
        with _eval_mode(self.model):
            for start in range(0, len(ids), block):
                part = torch.tensor([ids[start : start + block]], dtype=torch.long, device=self.device)
                logits = self.model(part, cache=self.cache, last_only=True)
        self.read_ids += ids
        return logits[:, -1, :]


class _Reply:
    """One reply's state: the text of the part being decoded, and whether it is in `messages` yet."""

    def __init__(self, messages: list[dict]) -> None:
        self.messages, self.open = messages, True
        self.text, self.sent = "", 0  # the part's text, and how much of it went out

    def close(self) -> None:
        if self.open:
            self.messages.append({"role": "assistant", "content": self.text})
            self.open = False

    def generate(self, model, tokenizer, template, budget, pick, fmt, tools, max_calls, context):
        defined, calls = definitions(tools), 0
        sequence = _Sequence(model, context)
        while True:
            ids = template.encode(tokenizer, for_template(self.messages), add_generation_prompt=True, tools=defined)
            room = min(budget, sequence.capacity - len(ids))
            if room <= 0:
                return
            counted = _Counted(pick)
            self.text, self.sent = "", 0
            tokens = sequence.tokens(ids, room, counted, tokenizer.eos_id)
            for piece in token_text(tokenizer, tokens, template.end_of_turn):
                yield from self._released(piece, fmt)
            budget -= counted.count
            ended = counted.count < room  # the model ended its turn (a reply cut by the budget calls nothing)
            added, results = answer_calls(self.text, fmt, tools, calls + 1) if fmt and ended else ([], [])
            if not results or calls + len(results) > max_calls:
                yield from self._released(None, fmt)
                return
            self.messages.extend(added)
            self.text = ""  # the call is in `messages` now; what follows is the next part's
            calls += len(results)
            yield from results

    def _released(self, piece: str | None, fmt: ToolFormat | None) -> Iterator[str]:
        """The text that can go out after `piece` (None: the part's end, whatever is held back)."""
        if piece is not None:
            self.text += piece
        end = len(self.text)
        if piece is not None and fmt is not None:
            found = split(self.text, fmt, final=False)
            end = found.start if found.start is not None else end - call_prefix(self.text, fmt)
        if end > self.sent:
            yield self.text[self.sent : end]
            self.sent = end
