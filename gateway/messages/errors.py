"""Every failure on the Messages routes leaves in Anthropic's shape:
`{"type": "error", "error": {"type": ..., "message": ...}}`.

The gateway's own handlers (`gateway.errors.exception_handlers`) decide status, message and
headers; the app wraps each of them (`with_messages_errors`), which rewrites only the body of an
answer to a request under /v1/messages, with the error type Anthropic gives
that status (400 invalid_request_error, 401 authentication_error, 404 not_found_error, 413
request_too_large, 429 rate_limit_error, 503/529 overloaded_error, 5xx api_error).
"""

from __future__ import annotations

from typing import Any, Callable

from litestar import MediaType, Request, Response

from gateway.errors import APIError
from gateway.messages.protocol import ErrorBody, ErrorDetail
from gateway.messages.translate import renamed

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    422: "invalid_request_error",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def error_type(status: int) -> str:
    return ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")


def error_body(err: APIError) -> ErrorBody:
    return ErrorBody(error=ErrorDetail(type=error_type(err.status), message=err.message))


def anthropic_response(status: int, message: str, headers: Any = None) -> Response[ErrorBody]:
    body = ErrorBody(error=ErrorDetail(type=error_type(status), message=message))
    return Response(body, status_code=status, headers=dict(headers or {}), media_type=MediaType.JSON)


PATH = "/v1/messages"


def is_messages_request(request: Request[Any, Any, Any]) -> bool:
    path = request.scope.get("path", "")
    return path == PATH or path.startswith(PATH + "/")


def anthropic_shaped(handler: Callable[..., Response[Any]]) -> Callable[..., Response[Any]]:
    """`handler`, answering in Anthropic's shape on the Messages paths (any method: a GET is a 405
    in that shape too) and unchanged elsewhere."""

    def handle(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
        if not is_messages_request(request):
            return handler(request, exc)
        if isinstance(exc, APIError):
            exc = renamed(exc)
            if exc.param and exc.param not in exc.message:  # Anthropic's body has no `param`: say it
                exc.message = f"{exc.message.rstrip('.')} (at '{exc.param}')."
        response = handler(request, exc)
        message = response.content.error.message  # gateway.protocol.ErrorBody
        if response.status_code == 401 and "Authorization header" in message:
            message = message.replace(
                "in the Authorization header", "in the x-api-key header or the Authorization header"
            )
        return anthropic_response(response.status_code, message, response.headers)

    return handle


def with_messages_errors(handlers: dict[Any, Any]) -> dict[Any, Any]:
    """The app's exception handlers (`gateway.errors.exception_handlers`), Anthropic-shaped on
    the Messages paths."""
    return {kind: anthropic_shaped(handler) for kind, handler in handlers.items()}
