"""Every error as OpenAI's JSON error body, so clients that speak the OpenAI API read ours:

    {"error": {"message": "...", "type": "invalid_request_error", "param": "max_tokens", "code": null}}

400 for anything wrong in the request (bad JSON, a missing or badly typed field, an unknown model,
a text the tokenizer cannot encode, a value past a cap), 401 without the API key, 404 for an
unknown path, 429 when a model's queue is full (with Retry-After). A `UserError` from the library
(the same one-line messages the command line prints) becomes a 400 with its message.
"""

import logging
from collections.abc import Sequence

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from attnlab.errors import UserError

TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
}

log = logging.getLogger("attnlab.serve")
BRANCHES = {"str", "int", "float", "bool", "list", "dict", "none"}


class APIError(Exception):
    """An error the server answers with `status` and OpenAI's error body; `param` names the request
    field at fault."""

    def __init__(
        self, status: int, message: str, *, param: str | None = None, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.headers = status, message, param, headers


def error_body(status: int, message: str, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": TYPES.get(status, "server_error"), "param": param, "code": None}}


def error_response(status: int, message: str, param: str | None = None, headers=None) -> JSONResponse:
    return JSONResponse(error_body(status, message, param), status_code=status, headers=headers)


def install_error_handlers(app: FastAPI) -> None:
    """Answer every error of `app` as a JSON error body (FastAPI's own answer validation errors with 422)."""

    async def api_error(_: Request, e: APIError) -> JSONResponse:
        return error_response(e.status, e.message, e.param, e.headers)

    async def user_error(_: Request, e: UserError) -> JSONResponse:
        return error_response(400, str(e))

    async def invalid(_: Request, e: RequestValidationError) -> JSONResponse:
        message, param = describe_validation_error(e.errors())
        return error_response(400, message, param)

    async def http_error(request: Request, e: HTTPException) -> JSONResponse:
        message = str(e.detail)
        if e.status_code in (404, 405):
            message = f"no route for {request.method} {request.url.path}; see /docs for the API"
        return error_response(e.status_code, message, headers=e.headers)

    async def bug(request: Request, e: Exception) -> JSONResponse:
        # A bug, not a bad request: log its traceback, answer JSON, keep serving.
        log.error("%s %s failed", request.method, request.url.path, exc_info=e)
        return error_response(500, f"internal error ({type(e).__name__}); the server log has the details")

    app.add_exception_handler(APIError, api_error)
    app.add_exception_handler(UserError, user_error)
    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(Exception, bug)


def describe_validation_error(errors: Sequence[dict]) -> tuple[str, str | None]:
    """pydantic's first error as one line and the field it is about ("stop", "input[2]"); the
    others are usually the same mistake seen by another branch of a union type."""
    # A list given to a `str | list[str]` field fails both branches; the list branch says why (and
    # of `prompt`'s token ids, the branch of lists of lists, not that of plain ids).
    scalar = ("string_type", "int_type")
    first = next((e for e in errors if not (e.get("type") in scalar and isinstance(e.get("input"), list))), None)
    first = first or errors[0]
    loc = [p for p in first.get("loc", ()) if p != "body"]
    if first.get("type") == "json_invalid":
        reason = (first.get("ctx") or {}).get("error", "")
        return "the request body is not valid JSON" + (f" ({reason})" if reason else ""), None
    if not loc and first.get("type") == "missing":
        return "the request body is empty: send a JSON object of the fields this endpoint documents (see /docs)", None
    if not loc:
        return "the request body must be a JSON object of the fields this endpoint documents (see /docs)", None
    # A union's branch names ("str", "list[str]") are pydantic's, not the field's: leave them out.
    path = [p for p in loc if isinstance(p, int) or not (p in BRANCHES or any(c in p for c in "[("))]
    param = "".join(f"[{p}]" if isinstance(p, int) else (f".{p}" if i else str(p)) for i, p in enumerate(path))
    message = first.get("msg", "invalid value").removeprefix("Value error, ")
    if first.get("type") == "extra_forbidden":
        message = "unknown field; see /docs for the fields this endpoint takes"
    elif first.get("type") == "missing":
        message = "this field is required"
    return f"{param}: {message}", param
