"""What every endpoint checks of a request before a model runs: the model it names (and that the
model answers the endpoint), its texts, its beam; each problem a 4xx naming the field."""

from fastapi import Request

from attnlab.errors import UserError
from attnlab.serve.errors import APIError
from attnlab.serve.limits import Limits
from attnlab.serve.registry import ServedModel
from attnlab.serve.schemas import TextsRequest

DEFAULT_BEAM = 5  # as `attnlab translate`


def find(request: Request, name: str, endpoint: str) -> ServedModel:
    """The served model `name`, checked to answer `endpoint`; a 400 naming the models there are."""
    served: dict[str, ServedModel] = request.app.state.models
    if name not in served:  # OpenAI answers an unknown model with 404 (model_not_found)
        raise APIError(404, f"model: no model {name!r} here; this server has {', '.join(served)}", param="model")
    served[name].require(endpoint)
    return served[name]


def server_limits(request: Request) -> Limits:
    return request.app.state.limits


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
