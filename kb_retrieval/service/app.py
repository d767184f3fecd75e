"""The ASGI app: the routes (``routes.py``, thin over a :class:`~kb_retrieval.service.runner.LookupRunner`), the
pages (``page.py``), ``/mcp``, the security middleware and the one error shape (``errors.py``).

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

``create_app`` builds what the routes share and puts it on ``app.state`` (``runner``, ``lookup``, ``serve``,
``health_pool``, ``mcp_server``); the routes read it through ``Depends`` (``dependencies.py``).

Example:
    >>> app = create_app(KnowledgeLookup(settings), ServeSettings())  # doctest: +SKIP
    >>> uvicorn.run(app, host="127.0.0.1", port=8765)  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager

from fastapi import FastAPI
from mcp.server.transport_security import TransportSecuritySettings

from kb_retrieval.engine import KnowledgeLookup
from kb_retrieval.service.errors import add_error_handlers
from kb_retrieval.service.mcp import make_mcp_server
from kb_retrieval.service.page import router as page_router
from kb_retrieval.service.routes import router as api_router
from kb_retrieval.service.runner import LookupRunner
from kb_retrieval.service.security import (
    AccessLogMiddleware,
    BearerTokenMiddleware,
    BodyLimitMiddleware,
    HostCheckMiddleware,
)
from kb_retrieval.service.settings import ServeSettings


def create_app(lookup: KnowledgeLookup, serve: ServeSettings | None = None) -> FastAPI:
    """The app over ``lookup`` (which the caller closes). Lookups run on a pool of ``retriever_workers`` threads."""
    serve = serve or ServeSettings()
    runner = LookupRunner(
        lookup,
        workers=lookup.settings.retrieval.retriever_workers,
        max_pending=serve.max_pending,
        max_overrides=serve.max_overrides,
    )
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
    app = FastAPI(
        title="kb-retrieval",
        summary="lookup_knowledge over HTTP and MCP",
        lifespan=_lifespan,
        docs_url=None,  # /docs is the page router's own: no CDN
        redoc_url=None,
    )
    app.state.runner = runner
    app.state.lookup = lookup
    app.state.serve = serve
    app.state.health_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kb-health")
    app.state.mcp_server = mcp_server
    app.router.routes.extend(mcp_app.routes)
    # Outermost last: the access log sees every request, refused ones included.
    app.add_middleware(BodyLimitMiddleware, max_bytes=serve.max_body_bytes, timeout_s=serve.body_timeout_s)
    app.add_middleware(BearerTokenMiddleware, token=serve.token.get_secret_value())
    app.add_middleware(HostCheckMiddleware, enforced=serve.checks_host(), allowed=serve.allowed_host_names())
    app.add_middleware(AccessLogMiddleware, stored_query=lookup.traces.stored_query)
    add_error_handlers(app)
    # The API before the page: a request tries the routes in order, and the lookups are the ones that count (the
    # paths do not overlap, and /openapi.json lists the API's routes only, so the order changes no answer).
    app.include_router(api_router)
    app.include_router(page_router)  # the retrieval-test page and /docs, served whole (no CDN)
    return app


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    async with app.state.mcp_server.session_manager.run():  # the MCP transport's task group lives with the app
        yield
    runner: LookupRunner = app.state.runner
    runner.close()  # in-flight lookups finish (their trace rows accepted) before the process goes on to close
    app.state.health_pool.shutdown(wait=False, cancel_futures=True)
