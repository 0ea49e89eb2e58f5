"""Every failure leaves the gateway as an OpenAI error body: {"error": {message, type, param, code}}.

`APIError` is what gateway code raises; the Litestar exception handlers below translate it, the
engine's `EngineError`, grammar spec errors, and Litestar's own errors (body validation, 404, 405,
413, ...) so that no error ever comes back in another shape.
"""

from __future__ import annotations

import logging
import re
from typing import Any, Callable

from litestar import MediaType, Request, Response
from litestar.exceptions import HTTPException, SerializationException, ValidationException

from gateway.protocol import ErrorBody, ErrorDetail
from runtime.api import EngineError

log = logging.getLogger("jumpgate.gateway")

INVALID_REQUEST = "invalid_request_error"
AUTHENTICATION = "authentication_error"
NOT_FOUND = "not_found_error"
SERVER_ERROR = "server_error"


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = INVALID_REQUEST,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> ErrorBody:
        return ErrorBody(error=ErrorDetail(message=self.message, type=self.type, param=self.param, code=self.code))


class ClientDisconnected(Exception):
    """The client went away before the response was ready (nobody will read the answer)."""


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def not_found(message: str, param: str | None = None, code: str | None = "not_found") -> APIError:
    return APIError(404, message, type=INVALID_REQUEST, param=param, code=code)


def model_not_found(model: str, param: str | None = "model") -> APIError:
    return APIError(
        404, f"The model '{model}' does not exist or you do not have access to it.", param=param, code="model_not_found"
    )


def context_length_exceeded(message: str, param: str | None = "messages") -> APIError:
    return APIError(400, message, param=param, code="context_length_exceeded")


def overloaded(message: str, retry_after_s: int = 1) -> APIError:
    return APIError(
        503, message, type=SERVER_ERROR, code="overloaded", headers={"Retry-After": str(max(1, int(retry_after_s)))}
    )


def unauthorized(message: str) -> APIError:
    return APIError(401, message, type=INVALID_REQUEST, code="invalid_api_key")


def from_engine_error(exc: EngineError, retry_after_s: int = 1) -> APIError:
    if exc.code == "context_length_exceeded":
        return context_length_exceeded(exc.message, exc.param or "messages")
    if exc.code == "overloaded":
        return overloaded(exc.message, retry_after_s)
    if exc.code == "engine_stopped":
        return APIError(503, exc.message, type=SERVER_ERROR, code="engine_stopped")
    if exc.code == "invalid_request":
        return bad_request(exc.message, exc.param)
    return APIError(500, exc.message, type=SERVER_ERROR, code=exc.code or "engine_error")


# --------------------------------------------------------------------------- msgspec paths → param

_PATH_RE = re.compile(r" - at `\$(?:\.data)?(?P<path>[^`]*)`$")
_MISSING_RE = re.compile(r"Object missing required field `(?P<field>[^`]+)`")


def stream_error(exc: BaseException, retry_after_s: int = 1) -> APIError:
    """The error a stream ends with once its headers are out: engine refusals mapped as for a whole
    response, anything unexpected logged and reported as a 500-type error."""
    if isinstance(exc, EngineError):
        return from_engine_error(exc, retry_after_s)
    if isinstance(exc, APIError):
        return exc
    log.exception("error while streaming", exc_info=exc)
    return APIError(
        500, "The server had an error while streaming the response.", type=SERVER_ERROR, code="internal_error"
    )


def param_from_path(path: str) -> str | None:
    """`$.messages[0].role` / `messages[0].role` / `data.messages[0].role` → `messages[0].role`."""
    path = path.strip()
    for prefix in ("$.data", "$", "data"):
        if path == prefix:
            return None
        if path.startswith(prefix + ".") or path.startswith(prefix + "["):
            path = path[len(prefix) :]
            break
    path = path.lstrip(".")
    return path or None


def describe_validation(message: str, key: str | None) -> tuple[str, str | None]:
    """Turn a msgspec validation message (+ Litestar's key) into (OpenAI message, param)."""
    m = _PATH_RE.search(message)
    if m:
        message = message[: m.start()]
        key = key if key is not None else m.group("path")
    param = param_from_path(key) if key else None
    missing = _MISSING_RE.search(message)
    if missing:
        param = f"{param}.{missing.group('field')}" if param else missing.group("field")
        return f"Missing required parameter: '{param}'.", param
    if param is None:
        return f"Invalid request body: {message}", None
    return f"Invalid value for '{param}': {message}", param


def from_msgspec_error(exc: Exception) -> APIError:
    """A `msgspec.ValidationError` / `DecodeError` raised by `msgspec.json.decode(body, type=...)`."""
    import msgspec

    if isinstance(exc, msgspec.ValidationError):
        message, param = describe_validation(str(exc), None)
        return bad_request(message, param)
    return bad_request(f"We could not parse the JSON body of your request: {exc}", None, code="invalid_json")


# --------------------------------------------------------------------------- Litestar handlers


def error_response(err: APIError) -> Response[ErrorBody]:
    return Response(err.body(), status_code=err.status, headers=err.headers, media_type=MediaType.JSON)


def handle_api_error(_: Request[Any, Any, Any], exc: APIError) -> Response[ErrorBody]:
    return error_response(exc)


def engine_error_handler(retry_after_s: int) -> Callable[[Request[Any, Any, Any], EngineError], Response[ErrorBody]]:
    def handle(_: Request[Any, Any, Any], exc: EngineError) -> Response[ErrorBody]:
        return error_response(from_engine_error(exc, retry_after_s))

    return handle


def handle_validation(_: Request[Any, Any, Any], exc: ValidationException) -> Response[ErrorBody]:
    extra = exc.extra if isinstance(exc.extra, list) else []
    if extra and isinstance(extra[0], dict):
        first = extra[0]
        raw, key = str(first.get("message", "")), first.get("key")
        if key == "data" and raw == "'data'":  # Litestar's wording for an empty body
            return error_response(bad_request("The request body is empty; expected a JSON object.", None))
        message, param = describe_validation(raw, key)
        if first.get("source") in ("path", "query", "header", "cookie") and key:
            param = str(key)
        return error_response(bad_request(message, param))
    return error_response(_from_http_exception(exc))


_STATUS_CODES = {
    400: (INVALID_REQUEST, "invalid_request"),
    401: (INVALID_REQUEST, "invalid_api_key"),
    403: (INVALID_REQUEST, "forbidden"),
    404: (INVALID_REQUEST, "not_found"),
    405: (INVALID_REQUEST, "method_not_allowed"),
    413: (INVALID_REQUEST, "request_too_large"),
    415: (INVALID_REQUEST, "unsupported_media_type"),
    429: (INVALID_REQUEST, "rate_limit_exceeded"),
    503: (SERVER_ERROR, "overloaded"),
}


def _from_http_exception(exc: HTTPException) -> APIError:
    status = exc.status_code
    type_, code = _STATUS_CODES.get(status, (SERVER_ERROR if status >= 500 else INVALID_REQUEST, None))
    detail = exc.detail or ""
    cause = exc.__cause__
    if status == 400 and isinstance(cause, SerializationException):
        return bad_request(f"We could not parse the JSON body of your request: {cause}", None, code="invalid_json")
    if status == 404:
        detail = (
            f"Not found: {detail}" if detail and detail != "Not Found" else "The requested resource does not exist."
        )
    elif status == 405:
        detail = "Method not allowed for this endpoint."
    elif status == 413:
        detail = "The request body is too large."
    headers = dict(exc.headers or {})
    return APIError(status, detail or "Request failed.", type=type_, code=code, headers=headers)


def handle_http_exception(_: Request[Any, Any, Any], exc: HTTPException) -> Response[ErrorBody]:
    return error_response(_from_http_exception(exc))


def handle_disconnect(_: Request[Any, Any, Any], exc: ClientDisconnected) -> Response[ErrorBody]:
    # 499 (nginx's "client closed request"): only the access log ever sees it
    return error_response(APIError(499, "Client closed the request.", code="client_closed_request"))


def handle_too_deep(_: Request[Any, Any, Any], exc: RecursionError) -> Response[ErrorBody]:
    # msgspec refuses JSON nested past Python's recursion limit while decoding the body
    return error_response(
        bad_request(
            "We could not parse the JSON body of your request: it is nested too deeply.", None, code="invalid_json"
        )
    )


def handle_unexpected(request: Request[Any, Any, Any], exc: Exception) -> Response[ErrorBody]:
    log.exception("internal error on %s %s", request.method, request.url.path, exc_info=exc)
    return error_response(
        APIError(
            500, "The server had an error while processing your request.", type=SERVER_ERROR, code="internal_error"
        )
    )


def exception_handlers(retry_after_s: int = 1) -> dict[Any, Any]:
    return {
        APIError: handle_api_error,
        ClientDisconnected: handle_disconnect,
        RecursionError: handle_too_deep,
        EngineError: engine_error_handler(retry_after_s),
        ValidationException: handle_validation,
        HTTPException: handle_http_exception,
        Exception: handle_unexpected,
    }
