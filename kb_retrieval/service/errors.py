"""The app's one error shape: every error is a JSON ``{"error": "<one line>"}`` with a 4xx or 5xx status, never a
traceback (the framework's own 404/405/400 included).

Example:
    >>> one_line(ValueError("first line\\nsecond line"))
    'ValueError: first line'
    >>> describe_validation([{"loc": ("body", "query"), "msg": "Field required", "type": "missing"}])
    'query: Field required'
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from kb_retrieval.overrides import request_refusal
from kb_retrieval.retrieval.query_check import EmptyQueryError
from kb_retrieval.retrieval.scope import ScopeFilterError
from kb_retrieval.service.models import FILTER_KINDS, OVERRIDABLE, ErrorBody
from kb_retrieval.service.runner import BusyError, QueryTooLongError, WorkerWaitError

#: The service's log of failed requests and lookups (the routes' too), under the name its lines have always had.
log = logging.getLogger("kb_retrieval.service.app")
#: The error responses a JSON route documents (each a :class:`ErrorBody`).
ERRORS: dict[int | str, dict[str, Any]] = {code: {"model": ErrorBody} for code in (401, 413, 422, 500, 503)}


class TooManyAlertsError(ValueError):
    """An Alertmanager payload over the server's limits (alerts, or one alert's characters): 413, nothing looked up."""


def one_line(exc: BaseException) -> str:
    """``exc`` as ``Type: its first line`` (at most 300 characters of it)."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300]}" if text else type(exc).__name__


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def describe_validation(errors: list[Any]) -> str:
    """Pydantic errors as one line (``where: what``; input values never echoed: they may be alert text)."""
    parts = []
    for item in errors:
        where = list(item.get("loc", ()))
        # A scope filter's kind tag follows its list index (filters.0.filter.operator): the index names it already.
        kept = [p for i, p in enumerate(where) if not (p in FILTER_KINDS and i and isinstance(where[i - 1], int))]
        loc = ".".join(str(p) for p in kept if p != "body") or "body"
        message = str(item.get("msg", "invalid")).removeprefix("Value error, ")
        if item.get("type") == "extra_forbidden":
            message = "unknown field"
            if loc.startswith("settings."):  # what was refused and why (overrides.py), then what a request may set
                message = request_refusal(loc.removeprefix("settings."))
                message += " (the settings a request may change: " + ", ".join(OVERRIDABLE) + ")"
        parts.append(f"{loc}: {message}")
    return "; ".join(parts)


def add_error_handlers(app: FastAPI) -> None:
    """Answer every error ``app`` can raise in the one shape, with its status (and ``retry-after`` on a 503)."""

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # The framework's own 4xx (no such route, method not allowed, a body it cannot parse) in the one error shape.
        message = {
            404: f"no such route: {request.url.path[:200]}",
            405: f"method {request.method} not allowed here",
        }.get(exc.status_code, str(exc.detail))
        if exc.status_code == 400 and "parsing the body" in message:  # the JSON decoder's own error, unsaid
            message = "request body cannot be read as JSON (not UTF-8, nested too deep, or a number too long)"
        return _error(exc.status_code, message, dict(exc.headers or {}))

    @app.exception_handler(RequestValidationError)
    async def invalid_request(_: Request, exc: RequestValidationError) -> JSONResponse:
        return _error(422, "invalid request: " + describe_validation(list(exc.errors())))

    @app.exception_handler(ValidationError)
    async def invalid_settings(_: Request, exc: ValidationError) -> JSONResponse:
        return _error(422, "invalid settings: " + describe_validation(exc.errors(include_url=False)))

    @app.exception_handler(EmptyQueryError)
    async def empty_query(_: Request, exc: EmptyQueryError) -> JSONResponse:
        return _error(422, str(exc))

    @app.exception_handler(ScopeFilterError)
    async def invalid_filters(_: Request, exc: ScopeFilterError) -> JSONResponse:
        return _error(422, f"invalid filters: {exc}")

    @app.exception_handler(QueryTooLongError)
    async def too_long(_: Request, exc: QueryTooLongError) -> JSONResponse:
        return _error(422, str(exc))

    @app.exception_handler(TooManyAlertsError)
    async def too_many_alerts(_: Request, exc: TooManyAlertsError) -> JSONResponse:
        return _error(413, str(exc))

    @app.exception_handler(BusyError)
    async def busy(_: Request, exc: BusyError) -> JSONResponse:
        return _error(503, str(exc), {"retry-after": "1"})

    @app.exception_handler(WorkerWaitError)
    async def no_worker(_: Request, exc: WorkerWaitError) -> JSONResponse:
        return _error(503, str(exc), {"retry-after": "1"})

    @app.exception_handler(Exception)
    async def unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.error("request failed: %s", one_line(exc), exc_info=exc)
        return _error(500, f"internal error ({type(exc).__name__}); the server log has the details")
