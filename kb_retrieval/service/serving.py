"""The uvicorn server every ``serve`` process runs: the one-process server (:mod:`kb_retrieval.service.server`) and
each worker of ``serve --workers N`` (:mod:`kb_retrieval.service.workers`) build it, its access log and their heap
the same way, and say where they listen in the same words.

Example:
    >>> listening_url(("0.0.0.0", 8080))
    ('http://127.0.0.1:8080', 'http://0.0.0.0:8080')
    >>> http_stack(ServeSettings(http="h11", loop="asyncio"))
    'h11 on asyncio'
"""

from __future__ import annotations

import gc
import importlib.util
import logging
import sys
from typing import Any

import uvicorn

from kb_retrieval.service.settings import ServeSettings

#: Where a local client reaches a server listening on every address.
_LOCAL = {"0.0.0.0": "127.0.0.1", "::": "[::1]"}


def configure_access_log(serve: ServeSettings) -> None:
    """The structured access log on stderr (one JSON line per request), when ``serve.access_log``."""
    if not serve.access_log:
        return
    access = logging.getLogger("kb_retrieval.access")
    access.setLevel(logging.INFO)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    access.addHandler(handler)
    access.propagate = False


def make_server(app: Any, serve: ServeSettings) -> uvicorn.Server:
    """uvicorn over ``app`` with the serve settings (address, graceful shutdown); ``run(sockets=...)`` in a worker."""
    config = uvicorn.Config(
        app,
        host=serve.host,
        port=serve.port,
        access_log=False,  # ours is structured and keeps query text out when traces do
        log_config=None,
        log_level="warning",
        lifespan="on",
        # SIGTERM: the requests in flight get this long, then their connections close (a lookup already
        # running on the pool still ends and its row is written: the lifespan waits for the pool).
        timeout_graceful_shutdown=serve.graceful_shutdown_s,
        http=serve.http,
        loop=serve.loop,
    )
    return uvicorn.Server(config)


def http_stack(serve: ServeSettings) -> str:
    """The HTTP parser and event loop uvicorn runs with, ``auto`` resolved as uvicorn resolves it (httptools and
    uvloop when they can be imported; the ``serve`` extra installs both), e.g. ``'httptools on uvloop'``: the
    start-up line says it, since the pure-Python pair costs a served lookup ~0.5 ms more."""
    http = serve.http if serve.http != "auto" else "httptools" if _importable("httptools") else "h11"
    loop = serve.loop
    if loop == "auto":
        loop = "uvloop" if sys.platform != "win32" and _importable("uvloop") else "asyncio"
    return f"{http} on {loop}"


def _importable(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def settle_heap() -> None:
    """Move what the start-up built (the models, indexes and libraries: some 240k objects on the runbooks corpus) out
    of the cyclic collector's reach: it lives as long as the process, and each full collection walked all of it, about
    140 ms once every ~180 lookups on this machine (0.4 ms frozen). Garbage made later is collected as before."""
    gc.collect()
    gc.freeze()


def listening_url(sockname: Any) -> tuple[str, str]:
    """A listening socket's address as ``(the URL a local client uses, the URL as bound)``."""
    host, port = sockname[:2]
    shown = f"[{host}]" if ":" in host else host
    return f"http://{_LOCAL.get(host, shown)}:{port}", f"http://{shown}:{port}"
