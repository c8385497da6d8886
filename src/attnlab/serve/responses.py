"""`POST /v1/responses`: OpenAI's Responses API, served by the chat path.

A request becomes a chat request (`chat_request`): `instructions` a system message first, `input`
(a text, or a list of messages, `function_call`s and their `function_call_output`s) the
conversation, `max_output_tokens`, `temperature`, `top_p`, `tools` (Responses' flat function
tools), `tool_choice`, `parallel_tool_calls`, and `text.format` as `response_format`. Its reply
becomes the response's `output`: a `message` item with the text (`output_text`), and a
`function_call` item per tool call (`attnlab.serve.tools`). `status` is "incomplete" (with
`incomplete_details.reason` "max_output_tokens") when the reply was cut by the token budget.

Streamed, the events are OpenAI's: `response.created`, `response.in_progress`, per item
`response.output_item.added`, for text `response.content_part.added`,
`response.output_text.delta`..., `response.output_text.done`, `response.content_part.done`, for a
call `response.function_call_arguments.delta`..., `response.function_call_arguments.done`, then
`response.output_item.done`, and last `response.completed` (or `response.incomplete`) with the
whole response; each numbered by `sequence_number`.

`previous_response_id` goes on from a stored response: its conversation (input and output,
without its instructions, as OpenAI's API does) comes before the new input. The server keeps the
conversations of its recent responses (`store`, true by default) in memory, at most
`KEPT_RESPONSES` of them and `KEPT_CHARACTERS` characters in all, the least recently used leaving
first; an unknown or evicted id is a 400 naming `previous_response_id`.
"""

import collections
import json
import time
import uuid
from collections.abc import AsyncIterator

from fastapi import Request

from attnlab.serve import chat, completions, tools
from attnlab.serve.errors import APIError, error_body
from attnlab.serve.limits import Limits
from attnlab.serve.registry import ServedModel
from attnlab.serve.schemas import ChatCompletionRequest, FunctionCallItem, InputMessage, ResponsesRequest

KEPT_RESPONSES = 256
KEPT_CHARACTERS = 4_000_000
# The chat request's fields as a Responses request names them, for the errors' `param`.
RENAMED = [
    ("response_format.json_schema.schema", "text.format.schema"),
    ("response_format.json_schema", "text.format"),
    ("response_format", "text.format"),
    ("tool_choice.function.name", "tool_choice.name"),
    ("max_completion_tokens", "max_output_tokens"),
    ("messages", "input"),
]


class ResponseStore:
    """Recent responses' conversations by id (chat messages), within a count and a size in
    characters of their JSON; the least recently used leave first."""

    def __init__(self, count: int = KEPT_RESPONSES, characters: int = KEPT_CHARACTERS) -> None:
        self.count, self.characters = count, characters
        self._kept: collections.OrderedDict[str, tuple[list[dict], int]] = collections.OrderedDict()
        self._size = 0

    def put(self, response_id: str, messages: list[dict]) -> None:
        size = len(json.dumps(messages, ensure_ascii=False))
        if size > self.characters:
            return
        self._kept[response_id] = (messages, size)
        self._size += size
        while len(self._kept) > self.count or self._size > self.characters:
            _, (_, dropped) = self._kept.popitem(last=False)
            self._size -= dropped

    def get(self, response_id: str) -> list[dict] | None:
        if response_id not in self._kept:
            return None
        self._kept.move_to_end(response_id)
        return self._kept[response_id][0]


def store_of(request: Request) -> ResponseStore:
    state = request.app.state
    if not hasattr(state, "responses"):
        state.responses = ResponseStore()
    return state.responses


def conversation(body: ResponsesRequest, history: list[dict]) -> list[dict]:
    """The chat messages of a stored conversation and the request's input: consecutive function
    calls join one assistant turn; an output must answer a call made before it (a 400 naming the
    input item, as one whose arguments are no JSON object)."""
    messages = [dict(m) for m in history]
    items = [InputMessage(role="user", content=body.input)] if isinstance(body.input, str) else body.input
    made = {c["id"] for m in messages for c in m.get("tool_calls") or ()}
    for i, item in enumerate(items):
        where = "input" if isinstance(body.input, str) else f"input[{i}]"
        if isinstance(item, InputMessage):
            messages.append({"role": "system" if item.role == "developer" else item.role, "content": item.text()})
        elif isinstance(item, FunctionCallItem):
            _check_arguments(item.arguments, f"{where}.arguments")
            call = {
                "id": item.call_id,
                "type": "function",
                "function": {"name": item.name, "arguments": item.arguments},
            }
            if messages and messages[-1]["role"] == "assistant":
                messages[-1] = {**messages[-1], "tool_calls": [*(messages[-1].get("tool_calls") or ()), call]}
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
            made.add(item.call_id)
        elif item.call_id not in made:
            message = f"{where}.call_id: no function_call with call_id {item.call_id!r} before it"
            raise APIError(400, message, param=f"{where}.call_id")
        else:
            messages.append({"role": "tool", "content": item.output, "tool_call_id": item.call_id})
    return messages


def _check_arguments(arguments: str, param: str) -> None:
    try:
        ok = isinstance(json.loads(arguments), dict)
    except ValueError:
        ok = False
    if not ok:
        raise APIError(400, f"{param}: must be a JSON object's text", param=param)


def chat_request(body: ResponsesRequest, messages: list[dict]) -> ChatCompletionRequest:
    """The chat request that serves a Responses request, `messages` its conversation."""
    system = [{"role": "system", "content": body.instructions}] if body.instructions else []
    fields = {
        "model": body.model,
        "messages": system + messages,
        "max_completion_tokens": body.max_output_tokens,
        "temperature": body.temperature,
        "top_p": body.top_p,
        "top_k": body.top_k,
        "seed": body.seed,
        "parallel_tool_calls": body.parallel_tool_calls,
    }
    if body.tools:
        fields["tools"] = [
            {"type": "function", "function": t.model_dump(exclude_none=True, exclude={"type"})} for t in body.tools
        ]
    if body.tool_choice is not None:
        choice = body.tool_choice
        fields["tool_choice"] = (
            choice if isinstance(choice, str) else {"type": "function", "function": {"name": choice.name}}
        )
    fmt = body.text.format if body.text else None
    if fmt is not None:
        fields["response_format"] = {"type": fmt.type}
        if fmt.type == "json_schema":
            schema = {"name": fmt.name or "response", "schema": fmt.schema_, "strict": fmt.strict}
            fields["response_format"]["json_schema"] = {k: v for k, v in schema.items() if v is not None}
    return ChatCompletionRequest.model_validate(fields)


def renamed(e: APIError) -> APIError:
    """A chat request's error with the Responses request's names for its fields."""
    for old, new in RENAMED:
        if e.param and e.param.startswith(old):
            param = new + e.param[len(old) :]
            return APIError(e.status, e.message.replace(e.param, param, 1), param=param, headers=e.headers)
    return e


async def create(served: ServedModel, body: ResponsesRequest, request: Request, limits: Limits):
    """The response (a dict in OpenAI's shape), or its events when `body.stream`."""
    store = store_of(request)
    history = []
    if body.previous_response_id is not None:
        history = store.get(body.previous_response_id)
        if history is None:
            message = f"previous_response_id: no response {body.previous_response_id!r} here (unknown, or evicted)"
            raise APIError(400, message, param="previous_response_id")
    messages = conversation(body, history)
    try:
        asked = chat_request(body, messages)
        ids, streams, use = await chat.start(served, asked, limits)
    except APIError as e:
        raise renamed(e) from None
    reply = Reply(body, served, ids, streams, use, messages, store)
    if body.stream:
        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        return completions.EventStream(reply.events(), media_type="text/event-stream", headers=headers)
    ((text, _),) = await completions.finished(streams, request)
    content, calls = tools.parse(text, use.format) if use.format is not None else (text, [])
    return reply.finish(content, calls)


class Reply:
    """One response being made: its id, its items, and the conversation it stores."""

    def __init__(self, body, served, ids, streams, use, messages, store) -> None:
        self.body, self.served, self.ids, self.streams, self.use = body, served, ids, streams, use
        self.messages, self.store = messages, store
        self.id, self.created = f"resp_{uuid.uuid4().hex}", int(time.time())
        self.sequence = 0

    def shape(self, status: str, output: list[dict], usage: dict | None = None) -> dict:
        """The response object, as OpenAI's API writes it."""
        body = self.body
        fmt = body.text.format.model_dump(by_alias=True, exclude_none=True) if body.text and body.text.format else None
        choice = body.tool_choice or "auto"
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": body.instructions,
            "max_output_tokens": body.max_output_tokens,
            "model": self.served.name,
            "output": output,
            "parallel_tool_calls": body.parallel_tool_calls is not False,
            "previous_response_id": body.previous_response_id,
            "temperature": body.temperature,
            "top_p": body.top_p,
            "tool_choice": choice if isinstance(choice, str) else choice.model_dump(),
            "tools": [t.model_dump(exclude_none=True) for t in body.tools or ()],
            "text": {"format": fmt or {"type": "text"}},
            "store": body.store is not False,
            "metadata": body.metadata or {},
            "usage": usage,
        }

    def finish(self, content: str | None, calls: list, ids: tuple = ()) -> dict:
        """The whole response once the reply has ended; stored for previous_response_id."""
        status = "incomplete" if self.streams[0].finish_reason == "length" and not calls else "completed"
        output = []
        if content is not None or not calls:
            output.append(message_item(ids[0] if ids else None, content or "", status))
        for j, call in enumerate(calls):
            output.append(call_item(ids[j + 1] if ids else None, call.id, call.function.name, call.function.arguments))
        if self.body.store is not False:
            turn = {"role": "assistant", "content": content}
            if calls:
                turn["tool_calls"] = [c.model_dump() for c in calls]
            self.store.put(self.id, [*self.messages, turn])
        return self.shape(status, output, self.usage())

    def usage(self) -> dict:
        counted = chat._usage(self.streams, self.ids)
        details = getattr(counted, "prompt_tokens_details", None)
        return {
            "input_tokens": counted.prompt_tokens,
            "input_tokens_details": {"cached_tokens": getattr(details, "cached_tokens", 0) or 0},
            "output_tokens": counted.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": counted.total_tokens,
        }

    def event(self, kind: str, **fields) -> str:
        data = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"

    async def events(self) -> AsyncIterator[str]:
        """The response's server-sent events (`Events` tracks its items)."""
        yield self.event("response.created", response=self.shape("in_progress", []))
        yield self.event("response.in_progress", response=self.shape("in_progress", []))
        items = Events(self)
        try:
            async for _, piece in completions.merged(self.streams):
                if piece is None and self.streams[0].error:
                    yield f"event: error\ndata: {json.dumps(error_body(500, self.streams[0].error))}\n\n"
                    return
                for text in items.piece(piece):
                    yield text
            for text in items.close():
                yield text
            response = self.finish(items.content(), items.calls(), items.ids)
            kind = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
            yield self.event(kind, response=response)
        finally:
            for s in self.streams:
                s.cancel()


def message_item(item_id: str | None, text: str, status: str = "completed") -> dict:
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    item_id = item_id or f"msg_{uuid.uuid4().hex}"
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": [part]}


def call_item(item_id: str | None, call_id: str, name: str, arguments: str, status: str = "completed") -> dict:
    item_id = item_id or f"fc_{uuid.uuid4().hex}"
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


class Events:
    """A streamed reply's items and their events: the chat path's deltas (text, and tool calls
    through `tools.ToolStream`) become a message item and function_call items, each opened when
    its first delta comes and closed when the next begins or the reply ends."""

    def __init__(self, reply: Reply) -> None:
        self.reply = reply
        fmt = reply.use.format
        self.reader = tools.ToolStream(fmt, bool(reply.use.forced)) if fmt is not None else None
        self.text: str | None = None  # the message item's text, once it has begun
        self.found: list[list] = []  # per call: [item id, call id, name, arguments]
        self.ids = [f"msg_{uuid.uuid4().hex}"]  # the message item's id, then each call item's
        self.open: str | None = None  # "message" or "call" while an item is open

    def piece(self, piece) -> list[str]:
        if piece is None:  # the reply's end: what the reader held back
            return self._deltas(self.reader.finish()) if self.reader else []
        if self.reader is None:
            return self._deltas([{"content": piece.text}] if piece.text else [])
        return self._deltas(self.reader.feed(piece.text))

    def _deltas(self, deltas: list[dict]) -> list[str]:
        out = []
        for delta in deltas:
            if delta.get("content"):
                out += self._text(delta["content"])
            for call in delta.get("tool_calls", ()):
                out += self._call(call)
        return out

    def _text(self, text: str) -> list[str]:
        event, out = self.reply.event, []
        if self.text is None:
            self.text, self.open = "", "message"
            out.append(event("response.output_item.added", output_index=0, item=self._message("in_progress", "")))
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            out.append(
                event("response.content_part.added", item_id=self.ids[0], output_index=0, content_index=0, part=part)
            )
        self.text += text
        out.append(
            event(
                "response.output_text.delta",
                item_id=self.ids[0],
                output_index=0,
                content_index=0,
                delta=text,
                logprobs=[],
            )
        )
        return out

    def _call(self, call: dict) -> list[str]:
        event, out = self.reply.event, []
        if "id" in call:  # a new call: the item before it ends
            out += self.close()
            self.ids.append(f"fc_{uuid.uuid4().hex}")
            self.found.append([self.ids[-1], call["id"], call["function"]["name"], ""])
            self.open = "call"
            item = call_item(self.ids[-1], call["id"], call["function"]["name"], "", "in_progress")
            out.append(event("response.output_item.added", output_index=self._index(), item=item))
        arguments = call["function"].get("arguments", "")
        if arguments:
            self.found[-1][3] += arguments
            index = self._index()
            out.append(
                event(
                    "response.function_call_arguments.delta", item_id=self.ids[-1], output_index=index, delta=arguments
                )
            )
        return out

    def _index(self) -> int:
        return len(self.found) - (0 if self.text is not None else 1)

    def _message(self, status: str, text: str) -> dict:
        return message_item(self.ids[0], text, status)

    def close(self) -> list[str]:
        """The events that end the open item."""
        event, out = self.reply.event, []
        if self.open == "message":
            part = {"type": "output_text", "text": self.text, "annotations": [], "logprobs": []}
            common = {"item_id": self.ids[0], "output_index": 0, "content_index": 0}
            out.append(event("response.output_text.done", **common, text=self.text, logprobs=[]))
            out.append(event("response.content_part.done", **common, part=part))
            out.append(event("response.output_item.done", output_index=0, item=self._message("completed", self.text)))
        elif self.open == "call":
            item_id, call_id, name, arguments = self.found[-1]
            index = self._index()
            done = {"item_id": item_id, "output_index": index, "name": name, "arguments": arguments}
            out.append(event("response.function_call_arguments.done", **done))
            out.append(
                event(
                    "response.output_item.done", output_index=index, item=call_item(item_id, call_id, name, arguments)
                )
            )
        self.open = None
        return out

    def content(self) -> str | None:
        return self.text if self.text is not None or not self.found else None

    def calls(self) -> list:
        from attnlab.serve.schemas import FunctionCall, ToolCall

        return [ToolCall(id=c, function=FunctionCall(name=n, arguments=a)) for _, c, n, a in self.found]
