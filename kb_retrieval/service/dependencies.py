"""What a route needs, read from ``app.state`` by FastAPI's ``Depends``: the routes close over nothing.

``create_app`` puts one of each on ``app.state`` (``runner``, ``lookup``, ``serve``, ``health_pool``); a route names
the ones it uses by type, e.g. ``async def traces(runner: Runner, lookup: Lookup)``. The functions are ``async``
(they only read an attribute), so FastAPI calls them on the event loop instead of a worker thread.

Example:
    >>> @router.get("/v1/traces")  # doctest: +SKIP
    ... async def traces(runner: Runner, lookup: Lookup) -> TraceRows: ...
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Annotated

from fastapi import Depends, Request

from kb_retrieval.engine import KnowledgeLookup
from kb_retrieval.service.runner import LookupRunner
from kb_retrieval.service.settings import ServeSettings


async def get_runner(request: Request) -> LookupRunner:
    """The app's lookup runner (its worker pool and admission)."""
    runner: LookupRunner = request.app.state.runner
    return runner


async def get_lookup(request: Request) -> KnowledgeLookup:
    """The lookup the app serves (its settings, traces, Milvus client); the caller of ``create_app`` closes it."""
    lookup: KnowledgeLookup = request.app.state.lookup
    return lookup


async def get_serve(request: Request) -> ServeSettings:
    """The server's own settings (``KB_SERVER_*``: limits on alerts, bodies, pending lookups)."""
    serve: ServeSettings = request.app.state.serve
    return serve


async def get_health_pool(request: Request) -> ThreadPoolExecutor:
    """The one thread that reads the chunk count for ``/healthz`` (never the lookups' workers, never the loop)."""
    pool: ThreadPoolExecutor = request.app.state.health_pool
    return pool


Runner = Annotated[LookupRunner, Depends(get_runner)]
Lookup = Annotated[KnowledgeLookup, Depends(get_lookup)]
Serve = Annotated[ServeSettings, Depends(get_serve)]
HealthPool = Annotated[ThreadPoolExecutor, Depends(get_health_pool)]
