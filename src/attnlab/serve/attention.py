"""`POST /v1/attention`: every layer's and head's attention weights for a text, as `attnlab
attention` draws them (`attnlab.viz.maps.attention_maps`) and the page's explorer shows them; any
served text model with attention answers it."""

import functools

from fastapi import Request
from fastapi.responses import JSONResponse

from attnlab.names import API
from attnlab.serve.errors import APIError
from attnlab.serve.requests import check_beam, check_text, encode, find, server_limits
from attnlab.serve.schemas import AttentionRequest


async def attention(body: AttentionRequest, request: Request) -> JSONResponse:
    """Every layer's and head's attention weights for a text, as `attnlab attention` draws them."""
    from attnlab.viz.html import attention_data
    from attnlab.viz.maps import attention_maps

    model, limits = find(request, body.model, API.attention), server_limits(request)
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
