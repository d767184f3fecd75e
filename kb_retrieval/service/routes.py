"""The JSON API's routes, thin over the :class:`~kb_retrieval.service.runner.LookupRunner`; what each needs (the
runner, the lookup, the server's settings) is injected by ``Depends`` from ``app.state`` (``dependencies.py``). The
router's route class (``json_body_route.py``) answers a well-formed JSON lookup without FastAPI's per-request work.

    GET  /healthz           200 with the collection, chunk count and lexical mode; 503 with the reason
    POST /v1/lookup         one lookup: the JSON ``lookup --json`` prints (or, ``Accept: text/plain``, the text)
    POST /v1/alertmanager   an Alertmanager webhook payload -> one result per alert, in payload order
    GET  /v1/traces         the latest ``tool_invocation`` rows

Example:
    >>> app.include_router(router)  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import re
import time
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from kb_retrieval.indexing.milvus import count_rows
from kb_retrieval.models import LookupResult
from kb_retrieval.output import result_json
from kb_retrieval.result import agent_text
from kb_retrieval.retrieval.query_check import EmptyQueryError, normalize_query
from kb_retrieval.service.alertmanager import alert_query
from kb_retrieval.service.dependencies import HealthPool, Lookup, Runner, Serve
from kb_retrieval.service.errors import ERRORS, TooManyAlertsError, log, one_line
from kb_retrieval.service.json_body_route import JSONBodyRoute
from kb_retrieval.service.models import (
    Alert,
    AlertmanagerPayload,
    AlertmanagerResponse,
    AlertResult,
    Health,
    LookupRequest,
    TraceRows,
)
from kb_retrieval.service.runner import WorkerWaitError
from kb_retrieval.service.settings import ServeSettings
from kb_retrieval.terminal import lookup_text
from kb_retrieval.traces import row_dict

HEALTH_TIMEOUT_S = 5.0
MAX_TRACE_ROWS = 500

router = APIRouter(route_class=JSONBodyRoute)  # a well-formed lookup skips FastAPI's per-request work


@router.get("/healthz", response_model=Health, responses={503: {"model": Health}})
async def healthz(lookup: Lookup, health_pool: HealthPool) -> JSONResponse:
    """Whether the collection can be searched: its chunk count read from Milvus now (bounded wait)."""
    settings = lookup.settings
    base: dict[str, Any] = {
        "collection": settings.storage.collection,
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
        reason = "no answer within 5 s" if isinstance(exc, TimeoutError) else one_line(exc)
        body = Health(status="unavailable", reason=settings.mask(f"Milvus: {reason}"), **base)
        return JSONResponse(body.model_dump(), status_code=503)
    if not chunks:  # nothing to search (never ingested, or its data lost): every lookup would find nothing
        reason = (
            f"the collection {settings.storage.collection} holds no chunks (lost or never ingested): run "
            "kb-retrieval ingest"
        )
        body = Health(status="unavailable", reason=reason, chunks=0, **base)
        return JSONResponse(body.model_dump(), status_code=503)
    return JSONResponse(Health(status="ok", chunks=chunks, **base).model_dump())


@router.post(
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
    lookup: Lookup,
    view: Annotated[Literal["agent", "terminal"], Query()] = "agent",
    full: bool = False,
    width: Annotated[int | None, Query(ge=20, le=1000)] = None,
) -> Response:
    """One lookup: exactly the JSON ``kb-retrieval lookup --json`` prints. With ``Accept: text/plain``: the agent's
    text, or with ``view=terminal`` (``full``, ``width``) what ``kb-retrieval lookup`` prints for a person."""
    request.scope["state"]["access"]["query"] = body.query
    runner.check_length(body.query)
    as_text = request.headers.get("accept", "").startswith("text/plain")

    def render(result: LookupResult) -> Response:  # on the lookup's thread, not the event loop
        if as_text and view == "terminal":
            return PlainTextResponse(lookup_text(result, lookup.settings.scoring, full=full, width=width))
        if as_text:
            return PlainTextResponse(agent_text(result))
        return Response(result_json(result.to_json_dict()), media_type="application/json")

    return await runner.lookup_rendered(render, body.query, body.overrides(), filters=body.filters)


@router.post("/v1/alertmanager", response_model=AlertmanagerResponse, responses=ERRORS)
async def alertmanager(payload: AlertmanagerPayload, runner: Runner, serve: Serve) -> AlertmanagerResponse:
    """An Alertmanager webhook (version 4): a lookup per firing alert, resolved ones skipped, in payload order.

    The whole batch is admitted before any lookup starts (503: nothing ran; 413: more than KB_SERVER_MAX_ALERTS
    alerts, or an alert over KB_SERVER_MAX_ALERT_CHARS). Every alert's lookup has the payload's deadline:
    ``KB_LOOKUP_TIMEOUT_S`` from its arrival, the wait for a worker included (one not started by then gets its
    own error entry), so the payload is answered within that bound. An alert that cannot be looked up
    (text that is not Unicode, no worker before its deadline, a failed lookup) gets its own ``error`` entry
    while the others answer."""
    arrived = time.monotonic()
    _refuse_oversized(payload, serve)
    results = [_alert_entry(alert) for alert in payload.alerts]
    pending = [(entry, query) for entry in results if (query := entry.query) is not None]
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
                log.error("alert lookup failed: %s", one_line(outcome), exc_info=outcome)
            entry.error = one_line(outcome) if not isinstance(outcome, WorkerWaitError) else str(outcome)
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


@router.get("/v1/traces", response_model=TraceRows, responses=ERRORS)
async def traces(
    runner: Runner,
    lookup: Lookup,
    limit: Annotated[int, Query(ge=1, le=MAX_TRACE_ROWS)] = 20,
    details: bool = True,
) -> TraceRows:
    """The latest ``tool_invocation`` rows, newest first (rows of lookups answered before are included)."""
    rows = await runner.call(lookup.traces.latest, limit)
    return TraceRows(rows=[row_dict(row, details=details) for row in rows])


def _refuse_oversized(payload: AlertmanagerPayload, serve: ServeSettings) -> None:
    """Raise :class:`TooManyAlertsError` (413, nothing looked up) for too many alerts or an alert too large."""
    if len(payload.alerts) > serve.max_alerts:
        raise TooManyAlertsError(f"{len(payload.alerts)} alerts; at most {serve.max_alerts} (KB_SERVER_MAX_ALERTS)")
    for number, alert in enumerate(payload.alerts, 1):
        size = sum(len(k) + len(v) for part in (alert.labels, alert.annotations) for k, v in part.items())
        if size > serve.max_alert_chars:
            name = _printable(alert.labels.get("alertname", ""))[:100]
            raise TooManyAlertsError(
                f"alert {number}{f' ({name})' if name else ''} carries {size} characters of labels and "
                f"annotations; at most {serve.max_alert_chars} (KB_SERVER_MAX_ALERT_CHARS): nothing was looked up"
            )


def _alert_entry(alert: Alert) -> AlertResult:
    """The alert's result entry before any lookup: skipped (resolved, nothing to search), an error (an empty
    query), or its ``query`` set (it is to be looked up)."""
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
    return entry


def _printable(text: str) -> str:
    """``text`` with any lone surrogate replaced (U+FFFD), so the response can be written as UTF-8."""
    return re.sub("[\ud800-\udfff]", "\ufffd", text)
