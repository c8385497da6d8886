"""Conversations for supervised fine-tuning: OpenAI's fine-tuning JSONL, checked line by line, and
each conversation rendered by a chat template into token ids with the assistant's tokens marked.

One line is one conversation, `{"messages": [...]}` (optionally `"tools": [...]`), roles system,
user, assistant and tool; an assistant message may carry `tool_calls` (OpenAI's shape, the
arguments a JSON object in a string) and `weight` 0 to leave it untrained. Every error names the
line. The mask (`render_conversation`) marks the assistant's tokens and their end-of-turn token:
where the template has `{% generation %}` blocks, the tokens of those blocks exactly as
`transformers`' `apply_chat_template(..., return_assistant_tokens_mask=True)` marks them; otherwise
by rendering the conversation incrementally, each assistant turn being what its message adds to
the prefix before it (which the template must render unchanged once later turns follow).

References: OpenAI's fine-tuning guide ("Preparing your dataset": the chat format, `weight`);
nanochat's `render_conversation` (the ids with their mask beside them); transformers' chat
templating guide.
"""

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnlab.data.chat_templates import TemplateRenderError, generation_spans, has_generation_blocks, render
from attnlab.errors import UserError

ROLES = ("system", "user", "assistant", "tool")
MESSAGE_KEYS = {"role", "content", "name", "tool_calls", "tool_call_id", "weight"}

# attnlab's own template, for a model that has none (a run pretrained here): ChatML's turns
# (OpenAI's Chat Markup Language, as Qwen writes it) with two special tokens of its own. A tool
# call is written as JSON between <tool_call> tags inside the assistant's turn.
ATTNLAB_TOKENS = ("<|im_start|>", "<|im_end|>")
ATTNLAB_END_OF_TURN = "<|im_end|>"
ATTNLAB_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' }}"
    "{%- if message.content %}{{- message.content }}{%- endif %}"
    "{%- for call in message.tool_calls or [] %}"
    "{{- '<tool_call>' + {'name': call.function.name, 'arguments': call.function.arguments} | tojson"
    " + '</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


@dataclass(frozen=True)
class Conversation:
    """One line of the file: its number (1-based) and its messages, checked."""

    line: int
    messages: tuple[dict[str, Any], ...]


@dataclass(frozen=True)
class Rendered:
    """A conversation as the model reads it: ids `(N,)` and, per id, whether it is trained."""

    line: int
    ids: list[int]
    mask: list[bool]


class ConversationError(UserError):
    """A line of a conversations file that cannot be trained on; the message names the line."""


def read_conversations(path: str | Path) -> list[Conversation]:
    """Every conversation of the JSONL file at `path` (blank lines skipped), checked; a
    `ConversationError` naming the first bad line and what is wrong with it."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise UserError(f"conversations file {path} does not exist; set data.path to a JSONL file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"conversations file {path} is unreadable ({e})") from None
    out = [parse_line(text, n, path) for n, text in enumerate(lines, 1) if text.strip()]
    if not out:
        raise UserError(f"{path} holds no conversation; write one JSON object a line")
    return out


def parse_line(text: str, line: int, path: str | Path = "<conversations>") -> Conversation:
    """One line -> a `Conversation`, or a `ConversationError` "FILE line N: why"."""
    where = f"{path} line {line}"
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConversationError(f"{where}: not JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("messages"), list) or not doc["messages"]:
        raise ConversationError(f'{where}: expected an object {{"messages": [...]}} with at least one message')
    tools = _tool_names(doc.get("tools"), where)
    messages = tuple(_message(m, i, where, tools) for i, m in enumerate(doc["messages"], 1))
    if not any(m["role"] == "assistant" and m.get("weight", 1) for m in messages):
        raise ConversationError(f"{where}: no assistant turn to train on; every conversation needs one")
    return Conversation(line, messages)


def _tool_names(tools: Any, where: str) -> set[str] | None:
    """The names of the line's `tools` (OpenAI's function definitions), or None where it lists none."""
    if tools is None:
        return None
    try:
        return {t["function"]["name"] for t in tools}
    except (TypeError, KeyError):
        raise ConversationError(
            f'{where}: "tools" must be a list of {{"type": "function", "function": {{"name": ...}}}}'
        ) from None


def _message(m: Any, i: int, where: str, tools: set[str] | None) -> dict[str, Any]:
    """Message `i` checked: a known role, text content (none only beside tool calls), known keys."""
    if not isinstance(m, dict):
        raise ConversationError(f"{where}: message {i} is not an object")
    role = m.get("role")
    if role not in ROLES:
        raise ConversationError(f"{where}: message {i} has unknown role {role!r}; roles are {', '.join(ROLES)}")
    if unknown := sorted(set(m) - MESSAGE_KEYS):
        raise ConversationError(
            f"{where}: message {i} has unknown key {unknown[0]!r}; keys are {', '.join(sorted(MESSAGE_KEYS))}"
        )
    calls = m.get("tool_calls")
    if calls is not None and role != "assistant":
        raise ConversationError(
            f"{where}: message {i} is a {role} message with tool_calls; only the assistant calls tools"
        )
    content = m.get("content")
    if not isinstance(content, str) and not (content is None and calls):
        raise ConversationError(f"{where}: message {i} needs its content as a string")
    if m.get("weight", 1) not in (0, 1):
        raise ConversationError(f"{where}: message {i} has weight {m['weight']!r}; weight is 0 or 1")
    out = dict(m)
    if calls is not None:
        out["tool_calls"] = [_tool_call(c, i, where, tools) for c in calls]
    return out


def _tool_call(call: Any, i: int, where: str, tools: set[str] | None) -> dict[str, Any]:
    """An OpenAI tool call with its arguments parsed (chat templates read them as an object)."""
    try:
        function = call["function"]
        name, arguments = function["name"], function["arguments"]
        arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
    except (TypeError, KeyError, json.JSONDecodeError):
        raise ConversationError(
            f'{where}: message {i} has a tool call that is not {{"type": "function", "function": '
            '{"name": ..., "arguments": "{JSON object}"}}'
        ) from None
    if not isinstance(name, str) or not isinstance(arguments, dict):
        raise ConversationError(f"{where}: message {i}: a tool call's name is a string and its arguments a JSON object")
    if tools is not None and name not in tools:
        raise ConversationError(
            f"{where}: message {i} calls unknown tool {name!r}; the line's tools are {sorted(tools)}"
        )
    return {**call, "function": {"name": name, "arguments": arguments}}


def render_conversation(
    conversation: Conversation, source: str, special_tokens: Mapping[str, str], tokenizer
) -> Rendered:
    """The conversation's ids by the template `source` and its mask: True on the assistant's
    tokens (and their end-of-turn token), False on the rest. `tokenizer`: a `tokenizers.Tokenizer`
    (`BPETokenizer.tokenizer`), which reads the template's special tokens as such and adds none of
    its own, as `apply_chat_template` tokenizes. A `ConversationError` naming the line where the
    template refuses the conversation or cannot tell the assistant's text."""
    try:
        text, spans = (_marked if has_generation_blocks(source) else _incremental)(conversation, source, special_tokens)
    except TemplateRenderError as e:
        raise ConversationError(f"line {conversation.line}: the chat template cannot render it: {e}") from None
    encoding = tokenizer.encode(text, add_special_tokens=False)
    return Rendered(conversation.line, list(encoding.ids), token_mask(encoding, spans))


def token_mask(encoding, spans: Sequence[tuple[int, int]]) -> list[bool]:
    """Per token, whether it lies in one of the character spans, by transformers' rule: from the
    token holding a span's first character to the one holding its last (`char_to_token`)."""
    mask = [False] * len(encoding.ids)
    for start, end in spans:
        first = encoding.char_to_token(start)
        if first is None or end <= start:
            continue
        last = encoding.char_to_token(end - 1)
        for t in range(first, (last if last is not None else len(mask) - 1) + 1):
            mask[t] = True
    return mask


def _marked(conversation: Conversation, source: str, special: Mapping[str, str]) -> tuple[str, list[tuple[int, int]]]:
    """The text and the spans of its `{% generation %}` blocks (weight 0 turns left out)."""
    marked = render(source, conversation.messages, special, add_generation_prompt=False, mark_generation=True)
    text, spans = generation_spans(marked)
    assistants = [m for m in conversation.messages if m["role"] == "assistant"]
    if len(spans) == len(assistants):  # one block a turn: a turn's weight applies to its block
        spans = [s for s, m in zip(spans, assistants, strict=False) if m.get("weight", 1)]
    return text, spans


def _incremental(
    conversation: Conversation, source: str, special: Mapping[str, str]
) -> tuple[str, list[tuple[int, int]]]:
    """The text and each trained assistant turn's span: what rendering message i adds to the
    prompt before it (`add_generation_prompt`), without the whitespace after its end-of-turn."""
    messages = conversation.messages
    text = render(source, messages, special, add_generation_prompt=False)
    spans = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant" or not message.get("weight", 1):
            continue
        before = render(source, messages[:i], special, add_generation_prompt=True)
        through = render(source, messages[: i + 1], special, add_generation_prompt=False)
        if not (through.startswith(before) and text.startswith(through)):
            raise ConversationError(
                f"line {conversation.line}: the chat template renders assistant turn {i + 1} differently once "
                "later turns follow, so its tokens cannot be told apart; use a template with {% generation %} blocks"
            )
        spans.append((len(before), len(through.rstrip())))
    return text, spans
