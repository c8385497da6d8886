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
import itertools
import json
import math
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

from fastapi import Request
from fastapi.responses import StreamingResponse

from attnlab.serve.errors import APIError, error_body
from attnlab.serve.limits import Limits
from attnlab.serve.registry import ServedModel
from attnlab.serve.schemas import (
    MAX_LOGPROBS,
    Completion,
    CompletionChoice,
    CompletionRequest,
    Logprobs,
    PromptTokensDetails,
    Usage,
)

DISCONNECT_POLL = 0.25  # seconds between checks that the client of a whole (unstreamed) completion is there


def encode_prompts(served: ServedModel, request: CompletionRequest, limits: Limits) -> list[list[int]]:
    """Each prompt's token ids (a text encoded, or ids checked against the vocabulary); a 400 for a
    prompt that is too long or that holds characters the tokenizer never saw. An empty prompt starts
    from the end-of-text token, or a newline (`attnlab.decode.encode_prompt`). A prompt scored whole
    (`echo` with `logprobs`) fits the model's context: past it, its tokens would be scored against
    windows of a sliding context that no single forward computes."""
    longest = served.context  # the worker's max_prompt_tokens
    scored = request.echo and request.logprobs is not None
    out = []
    for i, prompt in enumerate(request.prompts()):
        param = "prompt" if request.single_prompt else f"prompt[{i}]"
        ids = _prompt_ids(served, prompt, param, limits)
        if len(ids) > longest:
            raise APIError(
                400, f"{param}: {len(ids)} tokens, but model {served.name!r} takes at most {longest}", param=param
            )
        if scored and len(ids) > model_context(served):
            raise APIError(
                400,
                f"{param}: {len(ids)} tokens; echo with logprobs scores at most {model_context(served)}, the "
                f"context of model {served.name!r}",
                param=param,
            )
        out.append(ids)
    return out


def _prompt_ids(served: ServedModel, prompt: str | list[int], param: str, limits: Limits) -> list[int]:
    """One prompt's token ids: a text encoded, or token ids checked to be in the vocabulary."""
    from attnlab.decode import encode_prompt
    from attnlab.errors import UserError

    if isinstance(prompt, list):
        vocab = vocabulary(served)
        bad = next((t for t in prompt if t >= vocab), None)
        if bad is not None:
            raise APIError(400, f"{param}: token id {bad} is not in the vocabulary (0 to {vocab - 1})", param=param)
        return list(prompt)
    if len(prompt) > limits.max_text_chars:
        raise APIError(400, f"{param}: longer than this server's {limits.max_text_chars} characters", param=param)
    try:
        return encode_prompt(served.run.tokenizer, prompt)[0].tolist()
    except UserError as e:
        raise APIError(400, f"{param}: {e}", param=param) from None


def model_context(served: ServedModel) -> int:
    """The most tokens a language model reads at once (its block_size)."""
    return served.run.model.config.block_size


def room(served: ServedModel, limits: Limits, prompt_tokens: int, new_tokens: int, param: str) -> int:
    """How many of the new_tokens asked for a prompt of prompt_tokens may have: each is predicted
    from the whole sequence before it, at most the model's context, so the completion ends with
    finish_reason "length" where the next token would need more (never a token predicted from a
    sliding window past the context, which the model was never trained to read); a 400 naming the
    numbers when the prompt leaves no room for one. The server's `past_context` lifts it, and a
    model whose cache rolls (window attention, positions inside attention) has no such end."""
    from attnlab.decode.sampling import rolls_past_block

    if limits.past_context or new_tokens == 0 or rolls_past_block(served.run.model):
        return new_tokens
    context = model_context(served)
    if prompt_tokens > context:
        raise APIError(
            400,
            f"{param}: {prompt_tokens} tokens, past the {context}-token context of model {served.name!r}: a "
            f"completion of it would be predicted from its last {context} tokens alone; send at most {context} "
            "(or max_tokens 0)",
            param=param,
        )
    return min(new_tokens, context - prompt_tokens + 1)


def vocabulary(served: ServedModel) -> int:
    """How many token ids both the tokenizer and the model know: a prompt's ids and `logit_bias`'s
    keys are below it."""
    return min(served.run.tokenizer.vocab_size, served.run.model.config.vocab_size)


def check_fields(served: ServedModel, request: CompletionRequest) -> None:
    """A 400 for a value of an OpenAI field that this server does not serve: `logprobs` past
    OpenAI's 5, `best_of` other than 1 or n (nothing ranks completions here), a `suffix`, a
    `logit_bias` key that is no token id of the model."""
    if request.logprobs is not None and request.logprobs > MAX_LOGPROBS:
        raise APIError(
            400,
            f"logprobs: at most {MAX_LOGPROBS} most likely tokens per position, as in OpenAI's API",
            param="logprobs",
        )
    if request.best_of not in (None, 1, request.per_prompt):
        raise APIError(
            400,
            f"best_of: {request.best_of} is not served; this server does not rank completions: leave it out, or "
            "make it 1 or n",
            param="best_of",
        )
    if request.suffix:
        raise APIError(400, "suffix: text after the completion (insertion) is not served; leave it out", param="suffix")
    penalties(served, request)  # checks logit_bias


def penalties(served: ServedModel, request: CompletionRequest):
    """The request's presence and frequency penalties and logit bias, checked (`logit_bias`'s keys
    token ids of the model); None when all are at their defaults."""
    from attnlab.decode.sampling import Penalties

    vocab, bias = vocabulary(served), []
    for key, value in (request.logit_bias or {}).items():
        if not key.isdigit() or int(key) >= vocab:
            raise APIError(
                400, f"logit_bias: key {key!r} is not a token id of this model (0 to {vocab - 1})", param="logit_bias"
            )
        bias.append((int(key), value))
    found = Penalties(request.presence_penalty or 0.0, request.frequency_penalty or 0.0, tuple(bias))
    return found if found.active else None


def check_caps(request: CompletionRequest, limits: Limits) -> None:
    """A 400 when the request asks for more than the server's caps allow."""
    if request.new_tokens > limits.max_tokens:
        raise APIError(400, f"max_tokens: at most {limits.max_tokens} on this server", param="max_tokens")
    count = request.per_prompt * len(request.prompts())
    if count > limits.max_n:
        raise APIError(
            400, f"n: {count} completions asked (n x prompts); at most {limits.max_n} on this server", param="n"
        )


def submit(
    served: ServedModel, prompts: Sequence[list[int]], request: CompletionRequest, limits: Limits, masks=None
) -> list:
    """One stream per choice, in OpenAI's order, each within the model's context (`room`); a 429
    (nothing left queued) when the queue is full. `masks`: a function of the choice's index that
    makes its `TokenMask` (`response_format`), or None."""
    adjust = penalties(served, request)
    settings = []
    for i, ids in enumerate(prompts):
        param = "prompt" if request.single_prompt else f"prompt[{i}]"
        new = room(served, limits, len(ids), request.new_tokens, param)
        for j in range(request.per_prompt):
            mask = None if masks is None else masks(len(settings))
            settings.append((ids, sampling(request, j, adjust, new_tokens=new, mask=mask)))
    return submit_all(served, settings)


def submit_all(served: ServedModel, requests: Sequence[tuple[list[int], Any]]) -> list:
    """A stream for each (prompt ids, `Sampling`), all or none: when the model's queue fills
    midway, the streams already queued are cancelled and the answer is a 429 with Retry-After."""
    from attnlab.serve.worker import QueueFull

    streams = []
    try:
        for ids, settings in requests:
            streams.append(served.worker.submit(ids, settings))
    except QueueFull as e:
        for s in streams:
            s.cancel()
        retry = str(max(1, math.ceil(e.retry_after)))
        raise APIError(
            429, f"model {served.name!r} has a full queue; retry after {retry} s", headers={"Retry-After": retry}
        ) from None
    return streams


def sampling(request: CompletionRequest, choice: int, adjust=None, *, new_tokens: int | None = None, mask=None):
    """The worker's sampling settings for completion `choice` of a prompt: seed + choice, so that
    the choices of one request differ and choice 0 is what the same seed gives alone. `adjust`:
    the request's `Penalties` (`penalties`), None for none; `new_tokens`: its max_tokens within
    the context (`room`); `mask`: its `TokenMask`, if any."""
    from attnlab.serve.worker import Sampling

    return Sampling(
        max_tokens=request.new_tokens if new_tokens is None else new_tokens,
        temperature=1.0 if request.temperature is None else request.temperature,
        top_p=1.0 if request.top_p is None else request.top_p,
        top_k=request.top_k,
        seed=None if request.seed is None else request.seed + choice,
        stop=request.stops(),
        penalties=adjust,
        logprobs=request.logprobs,
        echo_logprobs=bool(request.echo) and request.logprobs is not None,
        mask=mask,
    )


async def finished(streams: list, request: Request) -> list[tuple[str, list]]:
    """Each stream's whole text and token scores, once every stream has finished (a 500 if one
    failed). A client that goes away meanwhile cancels the streams: nobody is waiting for the
    answer any more."""

    async def collect(stream) -> tuple[str, list]:
        texts, scores = [], []
        async for piece in stream:
            texts.append(piece.text)
            scores.extend(piece.scores)
        return "".join(texts), scores

    async def watch() -> None:
        while not await request.is_disconnected():
            await asyncio.sleep(DISCONNECT_POLL)
        for s in streams:
            s.cancel()

    watcher = asyncio.ensure_future(watch())
    try:
        found = await asyncio.gather(*(collect(s) for s in streams))
    finally:
        watcher.cancel()
        for s in streams:
            s.cancel()
    failed = next((s.error for s in streams if s.error), None)
    if failed:
        raise APIError(500, failed)
    return list(found)


async def complete(
    served: ServedModel, streams: list, prompts: Sequence[list[int]], request: Request, body: CompletionRequest
) -> Completion:
    """The whole completion, once every stream has finished."""
    found = await finished(streams, request)
    choices = []
    for i, ((text, scores), s) in enumerate(zip(found, streams, strict=True)):
        ids = prompts[i // body.per_prompt]
        head = echo_text(served, body, i) if body.echo else ""
        logprobs = None
        if body.logprobs is not None:
            rows = (list(s.prompt_scores) if body.echo else []) + scores
            logprobs = logprobs_of(served.run.tokenizer, (ids if body.echo else []) + [r.token for r in scores], rows)
        choices.append(CompletionChoice(text=head + text, index=i, logprobs=logprobs, finish_reason=s.finish_reason))
    usage = usage_of(streams, prompts)
    return Completion(id=_completion_id(), created=int(time.time()), model=served.name, choices=choices, usage=usage)


def stream_response(
    served: ServedModel, streams: list, prompts: Sequence[list[int]], body: CompletionRequest
) -> "EventStream":
    """The completion as server-sent events, as OpenAI's API streams it. With `echo`, each choice's
    first event is its prompt (and the prompt's `logprobs`); each later event's `logprobs` covers
    the tokens of its text, their `text_offset` counted in the choice's whole text."""
    head = {"id": _completion_id(), "object": "text_completion", "created": int(time.time()), "model": served.name}
    include_usage = body.stream_options is not None and body.stream_options.include_usage
    tokenizer, sent = served.run.tokenizer, [-1] * len(streams)  # characters sent per choice; -1: none yet

    def event(choices: list[dict], usage: dict | None = None) -> str:
        return f"data: {json.dumps({**head, 'choices': choices, 'usage': usage}, ensure_ascii=False)}\n\n"

    def chunk(index: int, text: str, ids: list[int], rows: list, reason: str | None = None) -> str:
        logprobs = logprobs_of(tokenizer, ids, rows, sent[index]) if body.logprobs is not None and ids else None
        sent[index] += len(text)
        dumped = logprobs.model_dump() if logprobs else None
        return event([{"text": text, "index": index, "logprobs": dumped, "finish_reason": reason}])

    async def events() -> AsyncIterator[str]:
        try:
            async for index, piece in merged(streams):
                if piece is None and streams[index].error:  # decoding failed: say so, as OpenAI's streams do
                    yield f"data: {json.dumps(error_body(500, streams[index].error))}\n\n"
                    return
                if sent[index] < 0:
                    sent[index] = 0
                    if body.echo:
                        ids = prompts[index // body.per_prompt]
                        yield chunk(index, echo_text(served, body, index), ids, streams[index].prompt_scores)
                if piece is None:  # stream `index` has ended
                    yield chunk(index, "", [], [], streams[index].finish_reason)
                elif piece.text or piece.scores:
                    yield chunk(index, piece.text, [r.token for r in piece.scores], list(piece.scores))
            if include_usage:
                yield event([], usage_of(streams, prompts).model_dump())
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


def echo_text(served: ServedModel, request: CompletionRequest, choice: int) -> str:
    """The prompt of choice `choice` as `echo` repeats it: the text sent, or token ids decoded."""
    prompt = request.prompts()[choice // request.per_prompt]
    return prompt if isinstance(prompt, str) else served.run.tokenizer.decode(prompt)


def logprobs_of(tokenizer, ids: list[int], rows: list, start: int = 0) -> Logprobs:
    """OpenAI's `logprobs` of tokens `ids` and their `TokenScore`s (None: a prompt's first token,
    which nothing predicts), their text starting at character `start` of the choice's text. Each
    row's `top_logprobs` holds the most likely tokens and the token itself, as OpenAI's does."""
    texts = {t: tokenizer.decode([t]) for t in set(ids) | {t for r in rows if r for t, _ in r.top}}
    tokens = [texts[t] for t in ids]
    top = []
    for row in rows:
        if row is None:
            top.append(None)
            continue
        best = {texts[t]: lp for t, lp in row.top}
        best.setdefault(texts[row.token], row.logprob)
        top.append(best)
    return Logprobs(
        tokens=tokens,
        token_logprobs=[None if r is None else r.logprob for r in rows],
        top_logprobs=top,
        text_offset=text_offsets(tokenizer, ids, tokens, start),
    )


def text_offsets(tokenizer, ids: list[int], tokens: list[str], start: int) -> list[int]:
    """Where each token's text starts: the lengths of the tokens' own texts added up, where they
    join into the text of ids; else (a character split between byte-level tokens shows as U+FFFD
    in each) the length of the text decoded before each token."""
    if "".join(tokens) == tokenizer.decode(ids):
        return list(itertools.accumulate((len(t) for t in tokens[:-1]), initial=start)) if tokens else []
    return [start + len(tokenizer.decode(ids[:k])) for k in range(len(ids))]


def usage_of(streams: Sequence, prompts: Sequence[list[int]]) -> Usage:
    """Token counts as OpenAI counts them: each prompt once, every choice's new tokens."""
    prompt = sum(len(ids) for ids in prompts)
    completion = sum(s.completion_tokens for s in streams)
    details = PromptTokensDetails(cached_tokens=cached_tokens(streams, prompts))
    total = prompt + completion
    return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=total, prompt_tokens_details=details)


def cached_tokens(streams: Sequence, prompts: Sequence[list[int]]) -> int:
    """The prompts' tokens the prefix cache held, each prompt counted once (as its tokens are): the
    most any of its choices found (a request's n choices of one prompt join together, the first
    prefilling what the others reuse)."""
    n = len(streams) // len(prompts) if prompts else 0  # prompt i's choices: streams i*n … i*n + n − 1
    return sum(max((s.cached_tokens for s in streams[i * n : i * n + n]), default=0) for i in range(len(prompts)))


def _completion_id() -> str:
    return f"cmpl-{uuid.uuid4().hex}"
