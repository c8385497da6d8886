"""`create_app`: the FastAPI application of `attnlab serve`, its routes and its guards.

Routes: `GET /` (the page) and `/static/*` (its files, served from this package: the page loads
nothing from the network), `GET /healthz`, and the API under `/v1` (see /docs): `GET /v1/models`,
`POST /v1/completions`, `/v1/chat/completions`, `/v1/responses` and `/v1/embeddings` (OpenAI-compatible),
`/v1/translations`, `/v1/classifications`, `/v1/tags`, `/v1/attention`.

With an API key, every request under `/v1` needs `Authorization: Bearer KEY` (401 otherwise). The
page itself, its assets and /healthz hold no secret and stay open: the page asks for the key and
sends it with its API calls (it keeps it in the browser's localStorage).
"""

import functools
import hmac
import json
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles

from attnlab import __version__
from attnlab.errors import UserError
from attnlab.serve import chat, completions, embeddings, responses
from attnlab.serve.errors import APIError, error_response, install_error_handlers
from attnlab.serve.limits import Limits
from attnlab.serve.registry import ATTENTION, CHAT, ServedModel, served_models
from attnlab.serve.schemas import (
    AttentionRequest,
    AttentionResponse,
    ChatCompletion,
    ChatCompletionRequest,
    Classification,
    ClassificationResponse,
    Completion,
    CompletionRequest,
    EmbeddingRequest,
    EmbeddingResponse,
    ModelCard,
    ModelList,
    ResponsesRequest,
    TaggedWord,
    Tagging,
    TaggingResponse,
    TextsRequest,
    TranslationRequest,
    TranslationResponse,
)

STATIC = Path(__file__).parent / "static"
DEFAULT_BEAM = 5  # as `attnlab translate`
# The page runs only its own scripts and talks only to its own server.
PAGE_POLICY = "default-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'; frame-ancestors 'none'"

DESCRIPTION = """Trained attnlab runs and Hugging Face checkpoints over HTTP. `POST /v1/completions`,
`POST /v1/chat/completions` (models with a chat template) and `GET /v1/models` follow OpenAI's API,
so the `openai` client works with `base_url="http://HOST:PORT/v1"`. Errors are OpenAI's JSON error
body. One process serves every model it was started with; to serve more
traffic, start several and put any HTTP load balancer in front."""


def create_app(runs: dict[str, Any], *, api_key: str | None = None, limits: Limits | None = None) -> FastAPI:
    """The application serving `runs` (name -> what `attnlab.load` returns). The language models'
    decoding threads start with the application (its lifespan) and stop with it. `limits`: default
    `Limits()`."""
    limits = limits or Limits()
    options = dict(max_batch=limits.max_batch, max_queue=limits.max_queue, batched=limits.batched, fused=limits.fused)
    options["weights"] = limits.weights
    options["cache_memory"] = limits.cache_memory
    if limits.max_prompt_tokens is not None:
        options["max_prompt_tokens"] = limits.max_prompt_tokens
    served = served_models(runs, worker_options=options)

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        workers = [m.worker for m in served.values() if m.worker is not None]
        for worker in workers:
            worker.start()
        try:
            yield
        finally:
            for worker in workers:
                worker.close()

    app = FastAPI(title="attnlab", version=__version__, description=DESCRIPTION, lifespan=lifespan)
    app.state.models = served
    app.state.limits = limits
    install_error_handlers(app)
    app.add_middleware(BodyLimit, max_bytes=limits.max_body_bytes)
    if api_key:
        app.add_middleware(BearerAuth, key=api_key)
    app.include_router(page_router())
    app.include_router(api_router())
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    return app


def page_router() -> APIRouter:
    from attnlab.viz.html import ATTENTION_CSS, ATTENTION_JS, VIRIDIS

    router = APIRouter(include_in_schema=False)

    @router.get("/")
    async def page() -> FileResponse:
        return FileResponse(STATIC / "index.html", headers={"Content-Security-Policy": PAGE_POLICY})

    # The attention explorer of `attnlab attention --out FILE.html`, reused as is by the page.
    @router.get("/static/attention-view.js")
    async def attention_script() -> Response:
        script = f"window.attentionView = {ATTENTION_JS.strip()};\nwindow.attentionColours = {json.dumps(VIRIDIS)};\n"
        return Response(script, media_type="text/javascript")

    @router.get("/static/attention-view.css")
    async def attention_style() -> Response:
        return Response(ATTENTION_CSS, media_type="text/css")

    @router.get("/healthz")
    async def healthz() -> dict:
        return {"status": "ok"}

    return router


def api_router() -> APIRouter:
    """The API under /v1. Its handlers below find the served models and the limits in the
    application's state (`create_app` puts them there). Every path also answers with a trailing
    slash (`/v1/completions/`): a redirect would answer a POST with an empty 307 that not every
    client follows, and one that does may drop the body."""
    router = APIRouter(prefix="/v1", redirect_slashes=False)
    routes = [
        ("/models", list_models, "GET", ModelList),
        ("/models/{name}", get_model, "GET", ModelCard),
        ("/completions", complete, "POST", Completion),
        (CHAT.removeprefix("/v1"), chat_complete, "POST", ChatCompletion),
        ("/responses", create_response, "POST", None),
        ("/translations", translate, "POST", TranslationResponse),
        ("/classifications", classify, "POST", ClassificationResponse),
        ("/tags", tag, "POST", TaggingResponse),
        ("/embeddings", embed, "POST", EmbeddingResponse),
        (ATTENTION.removeprefix("/v1"), attention, "POST", AttentionResponse),
    ]
    for path, handler, method, answer in routes:
        router.add_api_route(path, handler, methods=[method], response_model=answer)
        router.add_api_route(path + "/", handler, methods=[method], response_model=answer, include_in_schema=False)
    return router


def find(request: Request, name: str, endpoint: str) -> ServedModel:
    """The served model `name`, checked to answer `endpoint`; a 400 naming the models there are."""
    served: dict[str, ServedModel] = request.app.state.models
    if name not in served:  # OpenAI answers an unknown model with 404 (model_not_found)
        raise APIError(404, f"model: no model {name!r} here; this server has {', '.join(served)}", param="model")
    served[name].require(endpoint)
    return served[name]


def server_limits(request: Request) -> Limits:
    return request.app.state.limits


async def list_models(request: Request) -> ModelList:
    return ModelList(data=[model_card(m) for m in request.app.state.models.values()])


async def get_model(name: str, request: Request) -> ModelCard:
    served: dict[str, ServedModel] = request.app.state.models
    if name not in served:
        raise APIError(404, f"no model {name!r} here; this server has {', '.join(served)}", param="model")
    return model_card(served[name])


async def complete(body: CompletionRequest, request: Request) -> Any:
    """Continue each prompt with a language model (OpenAI's legacy completions API)."""
    model, limits = find(request, body.model, "/v1/completions"), server_limits(request)
    completions.check_caps(body, limits)
    completions.check_fields(model, body)
    prompts = completions.encode_prompts(model, body, limits)
    masks = await response_masks(model, body)
    streams = completions.submit(model, prompts, body, limits, masks)
    if body.stream:
        return completions.stream_response(model, streams, prompts, body)
    return await completions.complete(model, streams, prompts, request, body)


async def chat_complete(body: ChatCompletionRequest, request: Request) -> Any:
    """Reply to a conversation, through the model's chat template (OpenAI's chat completions API)."""
    served: dict[str, ServedModel] = request.app.state.models
    if body.model in served:
        chat.check_chat(served[body.model])  # a language model without a template: say why
    model, limits = find(request, body.model, CHAT), server_limits(request)
    ids, streams, use = await chat.start(model, body, limits)
    logprobs = bool(body.logprobs)
    if body.stream:
        include_usage = body.stream_options is not None and body.stream_options.include_usage
        calls, forced = use.format, bool(use.forced)
        return chat.stream_response(
            model, streams, ids, include_usage=include_usage, logprobs=logprobs, calls=calls, forced=forced
        )
    return await chat.complete(model, streams, ids, request, logprobs=logprobs, calls=use.format)


async def create_response(body: ResponsesRequest, request: Request) -> Any:
    """Reply to an input through the model's chat template (OpenAI's Responses API)."""
    served: dict[str, ServedModel] = request.app.state.models
    if body.model in served:
        chat.check_chat(served[body.model])
    model, limits = find(request, body.model, CHAT), server_limits(request)
    return await responses.create(model, body, request, limits)


async def response_masks(model: ServedModel, body: CompletionRequest | ChatCompletionRequest):
    """Each choice's grammar for the request's response_format (None for plain text), compiled in
    a worker thread: a large schema over a large vocabulary takes a while, and the event loop serves
    the other streams meanwhile."""
    from starlette.concurrency import run_in_threadpool

    if body.response_format is None or body.response_format.type == "text":
        return None
    from attnlab.serve import structured

    return await run_in_threadpool(structured.masks_for, model, body.response_format)


async def translate(body: TranslationRequest, request: Request) -> TranslationResponse:
    """Translate a sentence by beam search; with the decoder's cross-attention over it."""
    from attnlab.viz.attention import display_token

    model, limits = find(request, body.model, "/v1/translations"), server_limits(request)
    beam = check_beam(body.beam, limits)
    text = check_text(body.input, "input", limits)
    ids = encode(model.helper.tokenizer, text.strip(), "input")  # as `attnlab translate` reads a line
    limit = model.helper.data_config.max_len
    if len(ids) > limit:
        raise APIError(400, f"input: {len(ids)} tokens, but this model takes at most {limit}", param="input")
    align = functools.partial(model.helper.align, model.run.model, ids, model.device, beam=beam)
    found = await model.call(limits.max_queue, align)
    return TranslationResponse(
        model=model.name,
        input=body.input,
        translation=found.translation,
        source_tokens=found.source_tokens,
        target_tokens=found.target_tokens,
        source_labels=[display_token(t) for t in found.source_tokens],
        target_labels=[display_token(t) for t in found.target_tokens],
        attention=found.weights.tolist(),
    )


async def classify(body: TextsRequest, request: Request) -> ClassificationResponse:
    """The label of each text, with every label's probability."""
    model, limits = find(request, body.model, "/v1/classifications"), server_limits(request)
    texts = check_texts(body, limits)
    found = await model.call(limits.max_queue, model.helper.classify, model.run.model, texts, model.device)
    data = [
        Classification(index=i, input=t, label=r["label"], probabilities=by_probability(r["probabilities"]))
        for i, (t, r) in enumerate(zip(texts, found, strict=True))
    ]
    return ClassificationResponse(model=model.name, data=data)


async def tag(body: TextsRequest, request: Request) -> TaggingResponse:
    """Each word's tag (words split off as in UD English), with every tag's probability."""
    model, limits = find(request, body.model, "/v1/tags"), server_limits(request)
    texts = check_texts(body, limits)
    found = await model.call(limits.max_queue, model.helper.tag_probabilities, model.run.model, texts, model.device)
    data = [
        Tagging(index=i, input=t, words=[tagged_word(w, p) for w, p in words])
        for i, (t, words) in enumerate(zip(texts, found, strict=True))
    ]
    return TaggingResponse(model=model.name, data=data)


async def embed(body: EmbeddingRequest, request: Request) -> EmbeddingResponse:
    """One vector per text from a BERT encoder (OpenAI's embeddings API)."""
    model, limits = find(request, body.model, embeddings.ENDPOINT), server_limits(request)
    rows = embeddings.token_rows(model, body, limits)
    vectors = await model.call(limits.max_queue, model.embedder.embed, rows)
    return embeddings.response(model, body, rows, vectors)


async def attention(body: AttentionRequest, request: Request) -> JSONResponse:
    """Every layer's and head's attention weights for a text, as `attnlab attention` draws them."""
    from attnlab.viz.html import attention_data
    from attnlab.viz.maps import attention_maps

    model, limits = find(request, body.model, ATTENTION), server_limits(request)
    beam = check_beam(body.beam, limits)
    text = check_text(body.input, "input", limits)
    n = len(encode(model.run.tokenizer, text, "input"))
    if n > limits.max_attention_tokens:
        raise APIError(
            400,
            f"input: {n} tokens; this server shows attention for at most {limits.max_attention_tokens}",
            param="input",
        )
    maps = await model.call(
        limits.max_queue, functools.partial(attention_maps, model.run, text, kind=body.kind, beam=beam)
    )
    return JSONResponse({"object": "attention", "model": model.name, **attention_data(maps)})


def model_card(model: ServedModel) -> ModelCard:
    """A model's card. A language model's context is its own (block_size), and the longest prompt
    the server takes is said apart: a longer prompt is only echoed (`max_tokens` 0), unless the server
    goes past the context (`Limits.past_context`)."""
    if model.worker is None:
        context, longest = model.context, None
    else:
        context, longest = completions.model_context(model), model.context
    return ModelCard(
        id=model.name,
        created=model.created,
        task=model.task,
        endpoints=model.endpoints,
        context=context,
        max_prompt_tokens=longest,
    )


def check_text(text: str, param: str, limits: Limits) -> str:
    """`text`, or a 400 when it is blank or longer than the server takes."""
    if len(text) > limits.max_text_chars:
        raise APIError(400, f"{param}: longer than this server's {limits.max_text_chars} characters", param=param)
    if not text.strip():
        raise APIError(400, f"{param}: the text is empty", param=param)
    return text


def check_texts(body: TextsRequest, limits: Limits) -> list[str]:
    texts = body.texts()
    if len(texts) > limits.max_inputs:
        raise APIError(400, f"input: {len(texts)} texts; at most {limits.max_inputs} per request", param="input")
    single = isinstance(body.input, str)
    return [check_text(t, "input" if single else f"input[{i}]", limits) for i, t in enumerate(texts)]


def check_beam(beam: int | None, limits: Limits) -> int:
    """The beam size asked for, or the default (5, or the server's cap when lower); a 400 past the cap."""
    if beam is None:
        return min(DEFAULT_BEAM, limits.max_beam)
    if beam > limits.max_beam:
        raise APIError(400, f"beam: at most {limits.max_beam} on this server", param="beam")
    return beam


def encode(tokenizer, text: str, param: str) -> list[int]:
    """The token ids of `text`; a 400 naming the characters a character tokenizer never saw."""
    try:
        return tokenizer.encode(text)
    except UserError as e:
        raise APIError(400, f"{param}: {e}", param=param) from None


def by_probability(probabilities: dict[str, float]) -> dict[str, float]:
    return dict(sorted(probabilities.items(), key=lambda item: -item[1]))


def tagged_word(word: str, probabilities: dict[str, float]) -> TaggedWord:
    """A word and its most likely tag; "?" with probability 0 for a word the model never read."""
    ranked = by_probability(probabilities)
    tag = next(iter(ranked), "?")
    return TaggedWord(word=word, tag=tag, probability=ranked.get(tag, 0.0), probabilities=ranked)


class BearerAuth:
    """ASGI middleware: requests under /v1 need `Authorization: Bearer KEY`, else 401. The key is
    compared in constant time."""

    def __init__(self, app, key: str) -> None:
        self.app, self.key = app, key.encode()

    async def __call__(self, scope, receive, send) -> None:
        path = scope.get("path", "")
        if scope["type"] == "http" and (path == "/v1" or path.startswith("/v1/")) and not self._allowed(scope):
            message = "this server needs an API key: send the header 'Authorization: Bearer KEY'"
            response = error_response(401, message, headers={"WWW-Authenticate": "Bearer"})
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _allowed(self, scope) -> bool:
        header = dict(scope.get("headers", [])).get(b"authorization", b"")
        scheme, _, token = header.partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self.key)


class BodyLimit:
    """ASGI middleware: a request whose Content-Length is past `max_bytes` gets 413 before its body
    is read."""

    def __init__(self, app, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            length = dict(scope.get("headers", [])).get(b"content-length", b"0")
            if not length.isdigit() or int(length) > self.max_bytes:
                message = f"the request body is larger than this server's {self.max_bytes} bytes"
                await error_response(413, message)(scope, receive, send)
                return
        await self.app(scope, receive, send)
