"""`create_app`: the FastAPI application of `attnlab serve`, its routes and its guards.

Routes: `GET /` (the page) and `/static/*` (its files, served from this package: the page loads
nothing from the network), `GET /healthz`, and the API under `/v1` (see /docs): `GET /v1/models`,
`POST /v1/completions`, `/v1/chat/completions`, `/v1/responses` and `/v1/embeddings` (OpenAI-compatible),
`/v1/translations`, `/v1/classifications`, `/v1/tags`, `/v1/attention`.

With an API key, every request under `/v1` needs `Authorization: Bearer KEY` (401 otherwise). The
page itself, its assets and /healthz hold no secret and stay open: the page asks for the key and
sends it with its API calls (it keeps it in the browser's localStorage).
"""

import dataclasses
import hmac
import json
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import FileResponse, Response
from fastapi.staticfiles import StaticFiles

from attnlab import __version__
from attnlab.names import API
from attnlab.serve import chat, completions, embeddings, responses
from attnlab.serve.attention import attention
from attnlab.serve.errors import APIError, error_response, install_error_handlers
from attnlab.serve.limits import Limits
from attnlab.serve.registry import ServedModel, served_models
from attnlab.serve.requests import find, server_limits
from attnlab.serve.schemas import (
    AttentionResponse,
    ChatCompletion,
    ChatCompletionRequest,
    ClassificationResponse,
    Completion,
    CompletionRequest,
    EmbeddingRequest,
    EmbeddingResponse,
    ModelCard,
    ModelList,
    ResponsesRequest,
    TaggingResponse,
    TranslationResponse,
)
from attnlab.serve.tasks import classify, tag, translate

STATIC = Path(__file__).parent / "static"
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

    # The API's paths, as `attnlab.names.API` writes them: the page names no path of its own.
    @router.get("/static/api.js")
    async def api_paths() -> Response:
        return Response(f"window.attnlabApi = {json.dumps(dataclasses.asdict(API))};\n", media_type="text/javascript")

    @router.get("/healthz")
    async def healthz() -> dict:
        return {"status": "ok"}

    return router


def api_router() -> APIRouter:
    """The API under /v1. Its handlers below find the served models and the limits in the
    application's state (`create_app` puts them there). Every path also answers with a trailing
    slash (`/v1/completions/`): a redirect would answer a POST with an empty 307 that not every
    client follows, and one that does may drop the body."""
    router = APIRouter(redirect_slashes=False)
    routes = [  # every path of `attnlab.names.API`, each once
        (API.models, list_models, "GET", ModelList),
        (API.models + "/{name}", get_model, "GET", ModelCard),
        (API.completions, complete, "POST", Completion),
        (API.chat, chat_complete, "POST", ChatCompletion),
        (API.responses, create_response, "POST", None),
        (API.translations, translate, "POST", TranslationResponse),
        (API.classifications, classify, "POST", ClassificationResponse),
        (API.tags, tag, "POST", TaggingResponse),
        (API.embeddings, embed, "POST", EmbeddingResponse),
        (API.attention, attention, "POST", AttentionResponse),
    ]
    for path, handler, method, answer in routes:
        router.add_api_route(path, handler, methods=[method], response_model=answer)
        router.add_api_route(path + "/", handler, methods=[method], response_model=answer, include_in_schema=False)
    return router


async def list_models(request: Request) -> ModelList:
    return ModelList(data=[model_card(m) for m in request.app.state.models.values()])


async def get_model(name: str, request: Request) -> ModelCard:
    served: dict[str, ServedModel] = request.app.state.models
    if name not in served:
        raise APIError(404, f"no model {name!r} here; this server has {', '.join(served)}", param="model")
    return model_card(served[name])


async def complete(body: CompletionRequest, request: Request) -> Any:
    """Continue each prompt with a language model (OpenAI's legacy completions API)."""
    model, limits = find(request, body.model, API.completions), server_limits(request)
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
    model, limits = find(request, body.model, API.chat), server_limits(request)
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
    model, limits = find(request, body.model, API.chat), server_limits(request)
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


async def embed(body: EmbeddingRequest, request: Request) -> EmbeddingResponse:
    """One vector per text from a BERT encoder (OpenAI's embeddings API)."""
    model, limits = find(request, body.model, API.embeddings), server_limits(request)
    rows = embeddings.token_rows(model, body, limits)
    vectors = await model.call(limits.max_queue, model.embedder.embed, rows)
    return embeddings.response(model, body, rows, vectors)


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
