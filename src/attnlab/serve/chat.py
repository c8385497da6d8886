"""`POST /v1/chat/completions`: a conversation through the model's chat template, replies as
OpenAI's chat API writes them.

The messages become one prompt (`chat_template.ChatTemplate.render`, tokenized without the
tokenizer's own additions, as `transformers`' `apply_chat_template` does), decoded by the model's
worker like any completion: continuous batching, the same caps, the same cancellation when the
client goes away. A reply ends at the model's end of turn (the template's eos token and
generation_config.json's, as text), at a stop string, or at `max_completion_tokens`. Streamed,
each choice first gets `{"role": "assistant", "content": ""}`, then its text in pieces of whole
characters (`decode.text.TextPieces` holds back a character's first bytes until its last arrives),
then an empty delta with its `finish_reason`; `data: [DONE]` ends the stream. With `logprobs`,
each choice's reply tokens come with their log-probabilities in OpenAI's chat shape
(`logprobs.content[j]`: token, logprob, bytes, top_logprobs), streamed with the text they make.

Only Hugging Face folders whose files hold a chat template answer here; a model without one gets
a 400 that says so (an attnlab run was trained on plain text, not on conversations: its
`/v1/completions` continues text).
"""

import json
import time
import uuid
from collections.abc import AsyncIterator

from fastapi import Request

from attnlab.serve import completions, server_tools, tools
from attnlab.serve.chat_template import ChatTemplateError
from attnlab.serve.errors import APIError, error_body
from attnlab.serve.limits import Limits
from attnlab.serve.registry import ServedModel
from attnlab.serve.schemas import (
    ChatChoice,
    ChatCompletion,
    ChatCompletionRequest,
    ChatLogprobs,
    ChatReply,
    TokenLogprob,
    TopLogprob,
    Usage,
)
from attnlab.serve.tokens import token_bytes


def check_chat(served: ServedModel) -> None:
    """A 400 saying why a language model has no chat, unless it has one."""
    if served.task == "language-model" and served.chat is None:
        raise APIError(
            400,
            f"model {served.name!r} has no chat template (a Hugging Face folder brings one in its "
            "tokenizer_config.json or chat_template.jinja; an attnlab run was trained on plain text): "
            "use POST /v1/completions to continue a text",
            param="model",
        )


def check_caps(body: ChatCompletionRequest, limits: Limits) -> int:
    """The new tokens per reply; a 400 when the request asks for more than the server's caps allow."""
    new = body.new_tokens(limits.max_tokens)
    if new > limits.max_tokens:
        param = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
        raise APIError(400, f"{param}: at most {limits.max_tokens} on this server", param=param)
    if (body.n or 1) > limits.max_n:
        raise APIError(400, f"n: at most {limits.max_n} replies on this server", param="n")
    if body.top_logprobs and not body.logprobs:  # 0 or null without logprobs: what some clients send
        raise APIError(400, "top_logprobs: needs logprobs true", param="top_logprobs")
    return new


def encode_chat(
    served: ServedModel, body: ChatCompletionRequest, limits: Limits, messages: list[dict] | None = None, answered=None
) -> list[int]:
    """The conversation's token ids through the model's chat template (with the assistant's turn
    opened, and the request's tools, or the server's `answered` tools); a 400 for a text past the
    server's length, a tool call or tool message that does not hold together
    (`tools.template_message`), a template that refuses the messages, or a prompt longer than the
    model's context. `messages`: `template_messages`' (made here when None)."""
    messages = template_messages(body, limits) if messages is None else messages
    listed = tools.template_tools(body) or server_tools.definitions(answered or {})
    try:
        ids = served.chat.encode(served.run.tokenizer, messages, add_generation_prompt=True, tools=listed)
    except ChatTemplateError as e:
        raise APIError(400, f"messages: the model's chat template refused them: {e}", param="messages") from None
    if not ids:
        raise APIError(400, "messages: the chat template made an empty prompt of them", param="messages")
    if len(ids) > served.context:
        raise APIError(
            400,
            f"messages: {len(ids)} tokens with the chat template, but model {served.name!r} takes at most "
            f"{served.context}",
            param="messages",
        )
    return ids


def template_messages(body: ChatCompletionRequest, limits: Limits) -> list[dict]:
    """The request's messages as the chat template takes them; a 400 for a text past the server's
    length or a tool call or tool message that does not hold together (`tools.template_message`)."""
    messages = []
    for i, message in enumerate(body.messages):
        text = message.text()
        if len(text) > limits.max_text_chars:
            param = f"messages[{i}].content"
            raise APIError(400, f"{param}: longer than this server's {limits.max_text_chars} characters", param=param)
        messages.append(tools.template_message(body.messages, i, text))
    return messages


async def start(
    served: ServedModel, body: ChatCompletionRequest, limits: Limits
) -> tuple[list[int], list, "tools.ToolUse"]:
    """A checked chat request's prompt ids, its choices' streams (queued), and what it asks of tools.
    A forced tool call's or a response_format's grammar is compiled in a worker thread: a large
    schema over a large vocabulary takes a while, and the event loop serves the other streams
    meanwhile. Where the server answers tools itself (`limits.tools`: `server_tools`), each choice's
    stream is a `server_tools.ToolLoop`, which continues the reply past the calls it answers."""
    from starlette.concurrency import run_in_threadpool

    from attnlab.serve import structured

    new_tokens = check_caps(body, limits)
    use = tools.tool_use(served, body)
    answered = server_tools.answered(served, body, limits.tools)
    messages = template_messages(body, limits)
    ids = encode_chat(served, body, limits, messages, answered)
    masks = None
    if use.forced:
        masks = await run_in_threadpool(tools.forced_masks, served, use)
    elif body.response_format is not None and body.response_format.type != "text":
        masks = await run_in_threadpool(structured.masks_for, served, body.response_format)
    streams = submit(served, ids, body, new_tokens, limits, masks)
    if answered:
        streams = [server_tools.ToolLoop(served, s, messages, answered) for s in streams]
    return ids, streams, use


def submit(
    served: ServedModel, ids: list[int], body: ChatCompletionRequest, new_tokens: int, limits: Limits, masks=None
) -> list:
    """One stream per choice, within the model's context (`completions.room`); a 429 (nothing
    left queued) when the model's queue is full. `masks`: each choice's `TokenMask` by its index
    (`response_format`), or None."""
    from attnlab.serve.worker import Sampling

    stop = body.stops() + served.chat.end_of_turn
    adjust = completions.penalties(served, body)  # checks logit_bias's keys
    new_tokens = completions.room(served, limits, len(ids), new_tokens, "messages")
    settings = [
        Sampling(
            max_tokens=new_tokens,
            temperature=1.0 if body.temperature is None else body.temperature,
            top_p=1.0 if body.top_p is None else body.top_p,
            top_k=body.top_k,
            seed=None if body.seed is None else body.seed + j,
            stop=stop,
            penalties=adjust,
            logprobs=(body.top_logprobs or 0) if body.logprobs else None,
            mask=None if masks is None else masks(j),
        )
        for j in range(body.n or 1)
    ]
    return completions.submit_all(served, [(ids, s) for s in settings])


async def complete(
    served: ServedModel,
    streams: list,
    ids: list[int],
    request: Request,
    *,
    logprobs: bool = False,
    calls: tools.ToolFormat | None = None,
) -> ChatCompletion:
    """The whole reply of each choice, once every stream has finished (a client gone meanwhile
    cancels them, as for completions); with `logprobs`, its tokens' scores; with `calls`, the tool
    calls written in that format, read out of the reply (finish_reason "tool_calls")."""
    found = await completions.finished(streams, request)
    tokenizer = served.run.tokenizer
    choices = []
    for i, ((text, scores), s) in enumerate(zip(found, streams, strict=True)):
        content, called = tools.parse(text, calls) if calls is not None else (text, [])
        choices.append(
            ChatChoice(
                index=i,
                message=ChatReply(content=content, tool_calls=called or None),
                logprobs=chat_logprobs(tokenizer, scores) if logprobs else None,
                finish_reason="tool_calls" if called else s.finish_reason,
            )
        )
    usage, created = _usage(streams, ids), int(time.time())
    return ChatCompletion(id=_chat_id(), created=created, model=served.name, choices=choices, usage=usage)


def stream_response(
    served: ServedModel,
    streams: list,
    ids: list[int],
    *,
    include_usage: bool,
    logprobs: bool = False,
    calls: tools.ToolFormat | None = None,
    forced: bool = False,
):
    """The replies as server-sent `chat.completion.chunk` events, as OpenAI's API streams them: a
    chunk per piece of text, with its tokens' scores where `logprobs` asks for them; with `calls`,
    the tool calls in that format as `delta.tool_calls` (`tools.ToolStream`; `forced`: a grammar
    makes the reply calls, whose arguments go out as they come)."""
    head = {"id": _chat_id(), "object": "chat.completion.chunk", "created": int(time.time()), "model": served.name}
    tokenizer = served.run.tokenizer

    def event(index: int | None, delta: dict | None = None, finish: str | None = None, usage=None, scores=()) -> str:
        scored = chat_logprobs(tokenizer, list(scores)).model_dump() if logprobs and scores else None
        choice = {"index": index, "delta": delta, "logprobs": scored, "finish_reason": finish}
        choices = [] if index is None else [choice]
        return f"data: {json.dumps({**head, 'choices': choices, 'usage': usage}, ensure_ascii=False)}\n\n"

    readers = [tools.ToolStream(calls, forced) if calls is not None else None for _ in streams]

    def pieces(index: int, piece) -> list[str]:
        """The events of a piece of choice `index` (None: its end)."""
        reader = readers[index]
        if piece is None:
            tail = [event(index, d) for d in reader.finish()] if reader else []
            finish = "tool_calls" if reader and reader.called else streams[index].finish_reason
            return [*tail, event(index, {}, finish)]
        if reader is None:
            return [event(index, {"content": piece.text}, scores=piece.scores)] if piece.text or piece.scores else []
        deltas = reader.feed(piece.text)
        if piece.scores and not deltas:  # the scores go out with the piece they belong to, even held back
            deltas = [{"content": ""}]
        return [event(index, d, scores=piece.scores if j == 0 else ()) for j, d in enumerate(deltas)]

    async def events() -> AsyncIterator[str]:
        try:
            for i in range(len(streams)):
                yield event(i, {"role": "assistant", "content": ""})
            async for index, piece in completions.merged(streams):
                if piece is None and streams[index].error:  # decoding failed: say so, as OpenAI's streams do
                    yield f"data: {json.dumps(error_body(500, streams[index].error))}\n\n"
                    return
                for text in pieces(index, piece):
                    yield text
            if include_usage:
                yield event(None, usage=_usage(streams, ids).model_dump())
            yield "data: [DONE]\n\n"
        finally:
            for s in streams:
                s.cancel()

    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return completions.EventStream(events(), media_type="text/event-stream", headers=headers)


def chat_logprobs(tokenizer, scores: list) -> ChatLogprobs:
    """OpenAI's chat `logprobs` of reply tokens from their `TokenScore`s: each token's text (a part
    of a character shows as U+FFFD), its own bytes, and its most likely alternatives."""
    pieces = token_bytes(tokenizer).pieces

    def top(token: int, logprob: float) -> TopLogprob:
        data = pieces[token] if token < len(pieces) else b""
        return TopLogprob(token=tokenizer.decode([token]), logprob=logprob, bytes=list(data))

    content = [
        TokenLogprob(**top(r.token, r.logprob).model_dump(), top_logprobs=[top(t, lp) for t, lp in r.top])
        for r in scores
    ]
    return ChatLogprobs(content=content)


def _usage(streams: list, ids: list[int]) -> Usage:
    """The conversation's tokens once, every choice's new tokens, the prompt's tokens read from the
    prefix cache."""
    return completions.usage_of(streams, [ids])


def _chat_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex}"
