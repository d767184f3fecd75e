"""The ASGI app: thin routes over a :class:`~kb_retrieval.service.runner.LookupRunner`, and ``/mcp``.

    GET  /                  the retrieval-test page (static HTML and JS; content shown as text, never as HTML)
    GET  /docs              the API reference, drawn from /openapi.json by a script this app serves (no CDN)
    GET  /healthz           200 with the collection, chunk count and lexical mode; 503 with the reason (Milvus
                            unreachable, or a collection with no chunk to search)
    POST /v1/lookup         {"query": ..., "filters": {...}, "settings": {...}} -> the JSON ``lookup --json`` prints
                            (``filters``: a MetadataFilters scope, what ``KnowledgeLookup.lookup`` takes;
                            ``Accept: text/plain``: the agent's text, what ``lookup`` prints without ``--json``)
    POST /v1/alertmanager   an Alertmanager webhook payload -> one result per alert, in payload order
    GET  /v1/traces         the latest ``tool_invocation`` rows
    POST /mcp               MCP (streamable HTTP): the ``lookup_knowledge`` tool

Every error is a JSON ``{"error": "<one line>"}`` with a 4xx or 5xx status, never a traceback.

Example:
    >>> app = create_app(KnowledgeLookup(settings), ServeSettings())  # doctest: +SKIP
    >>> uvicorn.run(app, host="127.0.0.1", port=8765)  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Annotated, Any, Literal

from fastapi import Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from mcp.server.transport_security import TransportSecuritySettings
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from kb_retrieval.engine import KnowledgeLookup
from kb_retrieval.indexing.milvus import count_rows
from kb_retrieval.output import result_json
from kb_retrieval.overrides import request_refusal
from kb_retrieval.result import agent_text
from kb_retrieval.retrieval.query_check import EmptyQueryError, normalize_query
from kb_retrieval.retrieval.scope import ScopeFilterError
from kb_retrieval.service.alertmanager import alert_query
from kb_retrieval.service.mcp import make_mcp_server
from kb_retrieval.service.models import (
    FILTER_KINDS,
    OVERRIDABLE,
    AlertmanagerPayload,
    AlertmanagerResponse,
    AlertResult,
    ErrorBody,
    Health,
    LookupRequest,
    TraceRows,
)
from kb_retrieval.service.page import router as page_router
from kb_retrieval.service.runner import BusyError, LookupRunner, QueryTooLongError, WorkerWaitError
from kb_retrieval.service.security import (
    AccessLogMiddleware,
    BearerTokenMiddleware,
    BodyLimitMiddleware,
    HostCheckMiddleware,
)
from kb_retrieval.service.settings import ServeSettings
from kb_retrieval.terminal import lookup_text
from kb_retrieval.traces import row_dict

log = logging.getLogger(__name__)
HEALTH_TIMEOUT_S = 5.0
MAX_TRACE_ROWS = 500
ERRORS: dict[int | str, dict[str, Any]] = {code: {"model": ErrorBody} for code in (401, 413, 422, 500, 503)}


def get_runner(request: Request) -> LookupRunner:
    runner: LookupRunner = request.app.state.runner
    return runner


Runner = Annotated[LookupRunner, Depends(get_runner)]


def create_app(lookup: KnowledgeLookup, serve: ServeSettings | None = None) -> FastAPI:
    """The app over ``lookup`` (which the caller closes). Lookups run on a pool of ``retriever_workers`` threads."""
    serve = serve or ServeSettings()
    runner = LookupRunner(
        lookup,
        workers=lookup.settings.retriever_workers,
        max_pending=serve.max_pending,
        max_overrides=serve.max_overrides,
    )
    health_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kb-health")
    mcp_server = make_mcp_server(runner)
    mcp_app = mcp_server.streamable_http_app(
        streamable_http_path="/mcp",
        stateless_http=True,  # every call stands alone: no session to keep, any client reconnects freely
        json_response=True,
        # Host and Origin are checked for every route by HostCheckMiddleware (any loopback address, the allow-list);
        # the SDK's own check knows 127.0.0.1 only and would refuse a proxy's allowed name.
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        max_request_body_size=serve.max_body_bytes,
    )

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async with mcp_server.session_manager.run():  # the MCP transport's task group lives with the app
            yield
        runner.close()  # in-flight lookups finish (their trace rows accepted) before the process goes on to close
        health_pool.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(
        title="kb-retrieval",
        summary="lookup_knowledge over HTTP and MCP",
        lifespan=lifespan,
        docs_url=None,  # /docs is the page router's own: no CDN
        redoc_url=None,
    )
    app.state.runner = runner
    app.state.lookup = lookup
    app.router.routes.extend(mcp_app.routes)
    # Outermost last: the access log sees every request, refused ones included.
    app.add_middleware(BodyLimitMiddleware, max_bytes=serve.max_body_bytes, timeout_s=serve.body_timeout_s)
    app.add_middleware(BearerTokenMiddleware, token=serve.token.get_secret_value())
    app.add_middleware(HostCheckMiddleware, enforced=serve.checks_host(), allowed=serve.allowed_host_names())
    app.add_middleware(AccessLogMiddleware, stored_query=lookup.traces.stored_query)
    _add_error_handlers(app)

    app.include_router(page_router)  # the retrieval-test page and /docs, served whole (no CDN)

    @app.get("/healthz", response_model=Health, responses={503: {"model": Health}})
    async def healthz() -> JSONResponse:
        """Whether the collection can be searched: its chunk count read from Milvus now (bounded wait)."""
        settings = lookup.settings
        base: dict[str, Any] = {
            "collection": settings.collection,
            "milvus": "server" if settings.is_milvus_server() else "lite",
            "lexical_mode": lookup.lexical_mode,
            "index_version": lookup.index_version or None,
        }
        loop = asyncio.get_running_loop()
        try:
            chunks = await asyncio.wait_for(
                loop.run_in_executor(health_pool, count_rows, lookup.client, settings), HEALTH_TIMEOUT_S
            )
        except Exception as exc:
            reason = "no answer within 5 s" if isinstance(exc, TimeoutError) else _one_line(exc)
            body = Health(status="unavailable", reason=settings.mask(f"Milvus: {reason}"), **base)
            return JSONResponse(body.model_dump(), status_code=503)
        if not chunks:  # nothing to search (never ingested, or its data lost): every lookup would find nothing
            reason = (
                f"the collection {settings.collection} holds no chunks (lost or never ingested): run kb-retrieval "
                "ingest"
            )
            body = Health(status="unavailable", reason=reason, chunks=0, **base)
            return JSONResponse(body.model_dump(), status_code=503)
        return JSONResponse(Health(status="ok", chunks=chunks, **base).model_dump())

    @app.post(
        "/v1/lookup",
        responses={
            **ERRORS,
            200: {"description": "The LookupResult JSON (or, with Accept: text/plain, the agent's text)."},
        },
    )
    async def lookup_route(
        body: LookupRequest,
        request: Request,
        runner: Runner,
        view: Annotated[Literal["agent", "terminal"], Query()] = "agent",
        full: bool = False,
        width: Annotated[int | None, Query(ge=20, le=1000)] = None,
    ) -> Response:
        """One lookup: exactly the JSON ``kb-retrieval lookup --json`` prints. With ``Accept: text/plain``: the agent's
        text, or with ``view=terminal`` (``full``, ``width``) what ``kb-retrieval lookup`` prints for a person."""
        request.scope["state"]["access"]["query"] = body.query
        runner.check_length(body.query)
        result = await runner.lookup(body.query, body.overrides(), filters=body.filters)
        if request.headers.get("accept", "").startswith("text/plain"):
            if view == "terminal":
                return PlainTextResponse(lookup_text(result, lookup.settings.scoring, full=full, width=width))
            return PlainTextResponse(agent_text(result))
        return Response(result_json(result.to_json_dict()), media_type="application/json")

    @app.post("/v1/alertmanager", response_model=AlertmanagerResponse, responses=ERRORS)
    async def alertmanager(payload: AlertmanagerPayload, runner: Runner) -> AlertmanagerResponse:
        """An Alertmanager webhook (version 4): a lookup per firing alert, resolved ones skipped, in payload order.

        The whole batch is admitted before any lookup starts (503: nothing ran; 413: more than KB_SERVER_MAX_ALERTS
        alerts, or an alert over KB_SERVER_MAX_ALERT_CHARS). Every alert's lookup has the payload's deadline:
        ``KB_LOOKUP_TIMEOUT_S`` from its arrival, the wait for a worker included (one not started by then gets its
        own error entry), so the payload is answered within that bound. An alert that cannot be looked up
        (text that is not Unicode, no worker before its deadline, a failed lookup) gets its own ``error`` entry
        while the others answer."""
        arrived = time.monotonic()
        if len(payload.alerts) > serve.max_alerts:
            raise _TooManyAlertsError(
                f"{len(payload.alerts)} alerts; at most {serve.max_alerts} (KB_SERVER_MAX_ALERTS)"
            )
        for number, alert in enumerate(payload.alerts, 1):
            size = sum(len(k) + len(v) for part in (alert.labels, alert.annotations) for k, v in part.items())
            if size > serve.max_alert_chars:
                name = _printable(alert.labels.get("alertname", ""))[:100]
                raise _TooManyAlertsError(
                    f"alert {number}{f' ({name})' if name else ''} carries {size} characters of labels and "
                    f"annotations; at most {serve.max_alert_chars} (KB_SERVER_MAX_ALERT_CHARS): nothing was looked up"
                )
        results = []
        pending: list[tuple[AlertResult, str]] = []
        for alert in payload.alerts:
            entry = AlertResult(
                alertname=_printable(alert.labels.get("alertname", "")),
                fingerprint=_printable(alert.fingerprint),
                status=_printable(alert.status),
            )
            if alert.status == "resolved":
                entry.skipped = "resolved: no lookup for an alert that has ended"
            elif not (query := alert_query(alert.labels, alert.annotations)):
                entry.skipped = "nothing to search: no alertname, summary, description or label worth searching"
            else:
                try:
                    normalize_query(query, len(query) + 1)
                except EmptyQueryError as exc:
                    entry.error = str(exc)
                else:
                    entry.query = query
                    pending.append((entry, query))
            results.append(entry)
        with runner.admitted(len(pending)):
            done = await asyncio.gather(
                *(runner.lookup(query, arrived=arrived, admitted=True) for _, query in pending),
                return_exceptions=True,
            )
        for (entry, _), outcome in zip(pending, done, strict=True):
            if isinstance(outcome, BaseException):
                if not isinstance(outcome, Exception):
                    raise outcome
                if not isinstance(outcome, WorkerWaitError | EmptyQueryError):
                    log.error("alert lookup failed: %s", _one_line(outcome), exc_info=outcome)
                entry.error = _one_line(outcome) if not isinstance(outcome, WorkerWaitError) else str(outcome)
            else:
                entry.result = outcome.to_json_dict()
        failed = sum(1 for entry in results if entry.error)
        return AlertmanagerResponse(
            receiver=_printable(payload.receiver),
            alerts=len(results),
            looked_up=len(pending) - sum(1 for entry, _ in pending if entry.error),
            skipped=sum(1 for entry in results if entry.skipped),
            failed=failed,
            results=results,
        )

    @app.get("/v1/traces", response_model=TraceRows, responses=ERRORS)
    async def traces(
        runner: Runner, limit: Annotated[int, Query(ge=1, le=MAX_TRACE_ROWS)] = 20, details: bool = True
    ) -> TraceRows:
        """The latest ``tool_invocation`` rows, newest first (rows of lookups answered before are included)."""
        rows = await runner.call(lookup.traces.latest, limit)
        return TraceRows(rows=[row_dict(row, details=details) for row in rows])

    return app


class _TooManyAlertsError(ValueError):
    pass


def _printable(text: str) -> str:
    """``text`` with any lone surrogate replaced (U+FFFD), so the response can be written as UTF-8."""
    return re.sub("[\ud800-\udfff]", "\ufffd", text)


def _one_line(exc: BaseException) -> str:
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


def _add_error_handlers(app: FastAPI) -> None:
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

    @app.exception_handler(_TooManyAlertsError)
    async def too_many_alerts(_: Request, exc: _TooManyAlertsError) -> JSONResponse:
        return _error(413, str(exc))

    @app.exception_handler(BusyError)
    async def busy(_: Request, exc: BusyError) -> JSONResponse:
        return _error(503, str(exc), {"retry-after": "1"})

    @app.exception_handler(WorkerWaitError)
    async def no_worker(_: Request, exc: WorkerWaitError) -> JSONResponse:
        return _error(503, str(exc), {"retry-after": "1"})

    @app.exception_handler(Exception)
    async def unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.error("request failed: %s", _one_line(exc), exc_info=exc)
        return _error(500, f"internal error ({type(exc).__name__}); the server log has the details")
