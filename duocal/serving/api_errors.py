"""Every error `duocal serve` sends, in OpenAI's shape `{"error": {"message", "type", "param", "code"}}`,
with the status that says whose fault it is: the handlers for the app's exceptions, transformers' and ours."""

from __future__ import annotations

import logging

logger = logging.getLogger("duocal.serving")

ERROR_TYPES = {
    400: "invalid_request_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    500: "server_error",
    503: "server_error",
}


class ApiError(Exception):
    """A request the server answers with `status` and `message` (`param`: the body field at fault)."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    kind = ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_response(status: int, message: str, param: str | None = None, code: str | None = None):
    from fastapi.responses import JSONResponse

    return JSONResponse(status_code=status, content=error_body(status, message, param, code))


def api_error_response(err: ApiError):
    return error_response(err.status, err.message, err.param, err.code)


def http_error_response(status: int, detail) -> object:
    """transformers' and Starlette's HTTPExceptions: 422 (fields the handler does not know) is a 400."""
    status = 400 if status == 422 else status
    codes = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}
    return error_response(status, str(detail), code=codes.get(status))


def unexpected_error_response(err: BaseException):
    """A bug or a failed generation: logged with its traceback, answered as a 500 without one."""
    logger.error("duocal serve: a request failed", exc_info=err)
    return error_response(500, f"the server failed on this request ({type(err).__name__}: {err})"[:500])


def install_error_handlers(app, plan_error, worker_dead_error) -> None:
    """Map every exception a route can raise to the error shape (`plan_error`: a request the pool can never
    serve, 400; `worker_dead_error`: the batching worker is gone, 503; anything else: 500)."""
    from fastapi.exceptions import RequestValidationError
    from starlette.exceptions import HTTPException

    handlers = {
        ApiError: lambda _request, exc: api_error_response(exc),
        HTTPException: lambda _request, exc: http_error_response(exc.status_code, exc.detail),
        RequestValidationError: lambda _request, exc: error_response(400, f"invalid request: {exc.errors()!s:.300}"),
        plan_error: lambda _request, exc: error_response(400, str(exc)),
        worker_dead_error: lambda _request, exc: error_response(503, str(exc), code="worker_dead"),
        Exception: lambda _request, exc: unexpected_error_response(exc),
    }
    for kind, handler in handlers.items():
        app.add_exception_handler(kind, handler)
