"""`POST /v1/completions`: prompts to streams of the model's worker, and streams to OpenAI's bodies.

A request asks for `n` completions of each of its prompts; each one is a `Stream` of the model's
`ModelWorker`, decoded in the same batch as every other request's. Choice `i` of a request is
completion `i % n` of prompt `i // n` (OpenAI's order). With `stream: true` the text goes out as
server-sent events, one `data: {chunk}` per new piece of one choice, a last chunk per choice with
its `finish_reason`, then `data: [DONE]`. Whatever ends the response (the end, an error, the
client going away, which cancels the generator), the streams are cancelled in `finally`, so their
batch slots are free at the next decoding step.
"""

import asyncio
import json
import math
import time
import uuid
from collections.abc import AsyncIterator, Sequence

from fastapi import Request
from fastapi.responses import StreamingResponse

from attnlab.serve.errors import APIError, error_body
from attnlab.serve.limits import Limits
from attnlab.serve.registry import ServedModel
from attnlab.serve.schemas import Completion, CompletionChoice, CompletionRequest, Usage

DISCONNECT_POLL = 0.25  # seconds between checks that the client of a whole (unstreamed) completion is there


def encode_prompts(served: ServedModel, request: CompletionRequest, limits: Limits) -> list[list[int]]:
    """Each prompt's token ids; a 400 for a prompt that is too long or that holds characters the
    tokenizer never saw. An empty prompt starts from the end-of-text token, or a newline
    (`attnlab.decode.encode_prompt`)."""
    from attnlab.decode import encode_prompt
    from attnlab.errors import UserError

    longest = served.context  # the worker's max_prompt_tokens
    out = []
    for i, prompt in enumerate(request.prompts()):
        param = "prompt" if isinstance(request.prompt, str) else f"prompt[{i}]"
        if len(prompt) > limits.max_text_chars:
            raise APIError(400, f"{param}: longer than this server's {limits.max_text_chars} characters", param=param)
        try:
            ids = encode_prompt(served.run.tokenizer, prompt)[0].tolist()
        except UserError as e:
            raise APIError(400, f"{param}: {e}", param=param) from None
        if len(ids) > longest:
            raise APIError(
                400, f"{param}: {len(ids)} tokens, but model {served.name!r} takes at most {longest}", param=param
            )
        out.append(ids)
    return out


def check_caps(request: CompletionRequest, limits: Limits) -> None:
    """A 400 when the request asks for more than the server's caps allow."""
    if request.new_tokens > limits.max_tokens:
        raise APIError(400, f"max_tokens: at most {limits.max_tokens} on this server", param="max_tokens")
    count = request.per_prompt * len(request.prompts())
    if count > limits.max_n:
        raise APIError(
            400, f"n: {count} completions asked (n x prompts); at most {limits.max_n} on this server", param="n"
        )


def submit(served: ServedModel, prompts: Sequence[list[int]], request: CompletionRequest) -> list:
    """One stream per choice, in OpenAI's order; a 429 (nothing left queued) when the queue is full."""
    from attnlab.serve.worker import QueueFull

    streams = []
    try:
        for ids in prompts:
            for j in range(request.per_prompt):
                streams.append(served.worker.submit(ids, sampling(request, j)))
    except QueueFull as e:
        for s in streams:
            s.cancel()
        retry = str(max(1, math.ceil(e.retry_after)))
        raise APIError(
            429, f"model {served.name!r} has a full queue; retry after {retry} s", headers={"Retry-After": retry}
        ) from None
    return streams


def sampling(request: CompletionRequest, choice: int):
    """The worker's sampling settings for completion `choice` of a prompt: seed + choice, so that
    the choices of one request differ and choice 0 is what the same seed gives alone."""
    from attnlab.serve.worker import Sampling

    return Sampling(
        max_tokens=request.new_tokens,
        temperature=1.0 if request.temperature is None else request.temperature,
        top_p=1.0 if request.top_p is None else request.top_p,
        top_k=request.top_k,
        seed=None if request.seed is None else request.seed + choice,
        stop=request.stops(),
    )


async def complete(served: ServedModel, streams: list, prompts: Sequence[list[int]], request: Request) -> Completion:
    """The whole completion, once every stream has finished. A client that goes away meanwhile
    cancels the streams: nobody is waiting for the answer any more."""

    async def collect(stream) -> str:
        return "".join([piece.text async for piece in stream])

    async def watch() -> None:
        while not await request.is_disconnected():
            await asyncio.sleep(DISCONNECT_POLL)
        for s in streams:
            s.cancel()

    watcher = asyncio.ensure_future(watch())
    try:
        texts = await asyncio.gather(*(collect(s) for s in streams))
    finally:
        watcher.cancel()
        for s in streams:
            s.cancel()
    failed = next((s.error for s in streams if s.error), None)
    if failed:
        raise APIError(500, failed)
    choices = [
        CompletionChoice(text=text, index=i, finish_reason=s.finish_reason)
        for i, (text, s) in enumerate(zip(texts, streams, strict=True))
    ]
    usage = _usage(streams, prompts)
    return Completion(id=_completion_id(), created=int(time.time()), model=served.name, choices=choices, usage=usage)


def stream_response(
    served: ServedModel, streams: list, prompts: Sequence[list[int]], *, include_usage: bool
) -> "EventStream":
    """The completion as server-sent events, as OpenAI's API streams it."""
    head = {"id": _completion_id(), "object": "text_completion", "created": int(time.time()), "model": served.name}

    def event(choices: list[dict], usage: dict | None = None) -> str:
        return f"data: {json.dumps({**head, 'choices': choices, 'usage': usage}, ensure_ascii=False)}\n\n"

    async def events() -> AsyncIterator[str]:
        try:
            async for index, piece in merged(streams):
                if piece is None and streams[index].error:  # decoding failed: say so, as OpenAI's streams do
                    yield f"data: {json.dumps(error_body(500, streams[index].error))}\n\n"
                    return
                if piece is None:  # stream `index` has ended
                    reason = streams[index].finish_reason
                    yield event([{"text": "", "index": index, "logprobs": None, "finish_reason": reason}])
                elif piece.text:
                    yield event([{"text": piece.text, "index": index, "logprobs": None, "finish_reason": None}])
            if include_usage:
                yield event([], _usage(streams, prompts).model_dump())
            yield "data: [DONE]\n\n"
        finally:
            for s in streams:
                s.cancel()

    # no-cache and no proxy buffering: every event should reach the client as it is sent.
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return EventStream(events(), media_type="text/event-stream", headers=headers)


class EventStream(StreamingResponse):
    """A streamed response that closes its generator however the response ends. Starlette cancels
    the generator when the client goes away while it waits for a piece; a server that reports the
    disconnect by failing the next send instead (ASGI spec 2.4) would leave it suspended at its
    `yield`, with its streams still decoding, until it is garbage-collected."""

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.body_iterator.aclose()


async def merged(streams: Sequence) -> AsyncIterator[tuple[int, object]]:
    """(index, piece) of any stream as soon as it has one, and (index, None) when stream `index` ends."""
    iterators = [aiter(s) for s in streams]
    waiting = {asyncio.ensure_future(anext(it)): i for i, it in enumerate(iterators)}
    try:
        while waiting:
            done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            for future in sorted(done, key=waiting.get):
                i = waiting.pop(future)
                try:
                    piece = future.result()
                except StopAsyncIteration:
                    yield i, None
                    continue
                yield i, piece
                waiting[asyncio.ensure_future(anext(iterators[i]))] = i
    finally:
        for future in waiting:
            future.cancel()


def _usage(streams: Sequence, prompts: Sequence[list[int]]) -> Usage:
    """Token counts as OpenAI counts them: each prompt once, every choice's new tokens."""
    prompt = sum(len(ids) for ids in prompts)
    completion = sum(s.completion_tokens for s in streams)
    return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)


def _completion_id() -> str:
    return f"cmpl-{uuid.uuid4().hex}"
