"""``kb-retrieval serve``: build the lookup once, serve it with uvicorn, and drain the traces on the way out.

SIGTERM or Ctrl-C: uvicorn stops accepting connections and waits for the requests in flight, at most
``KB_SERVER_GRACEFUL_SHUTDOWN_S`` (a slow client cannot hold the process: its body must arrive within
``KB_SERVER_BODY_TIMEOUT_S``); the app's lifespan then waits for the lookups on the pool; last, closing the lookup
writes every trace row it accepted (the trace store's drain). A request answered is a row recorded.
"""

from __future__ import annotations

import gc
import logging
import signal
import socket
import sys
from importlib import import_module
from types import FrameType
from typing import Any

import uvicorn

from kb_retrieval.config import KBSettings
from kb_retrieval.service import discovery
from kb_retrieval.service.settings import ServeSettings, is_loopback


class ServeError(ValueError):
    """A setting ``serve`` refuses (printed as one line by the CLI)."""


def check_binding(serve: ServeSettings) -> None:
    """Only loopback without a token: any other address would hand the knowledge base to the network."""
    if not is_loopback(serve.host) and not serve.token.get_secret_value():
        raise ServeError(
            f"binding {serve.host} (not loopback) needs a bearer token: set KB_SERVER_TOKEN (or --token) and have "
            "clients send 'Authorization: Bearer <token>'"
        )


class AddressInUseError(ServeError):
    """The address and port cannot be bound (another server holds the port, or the address is not this machine's):
    exit status 3, said before anything is loaded."""


def check_address(serve: ServeSettings) -> None:
    """Bind the address once, as uvicorn will (``SO_REUSEADDR``), before the pipeline is loaded for nothing."""
    if serve.port == 0:
        return
    family = socket.AF_INET6 if ":" in serve.host.strip("[]") else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((serve.host.strip("[]"), serve.port))
        except OSError as exc:
            raise AddressInUseError(
                f"cannot listen on {serve.host} port {serve.port}: {exc.strerror or exc} (another server on that "
                "port? choose another with --port / KB_SERVER_PORT, or stop it)"
            ) from None


def run_server(settings: KBSettings, serve: ServeSettings) -> int:
    """Serve until SIGTERM / SIGINT; 0 on a clean stop. Raises ``ServeError`` for a setting it refuses and
    ``AddressInUseError`` for an address it cannot bind, both before anything is loaded. ``serve.workers`` > 1:
    that many worker processes (:mod:`kb_retrieval.service.workers`)."""
    check_binding(serve)
    check_address(serve)
    if serve.workers > 1:
        # Known debt: workers.py uses this module's server helpers, so this is a cycle the import test would
        # catch as a plain import; until those helpers move to their own module, it is imported by name.
        workers = import_module("kb_retrieval.service.workers")
        WorkerStartError, run_workers = workers.WorkerStartError, workers.run_workers

        try:
            return run_workers(settings, serve)
        except WorkerStartError as exc:
            raise ServeError(str(exc)) from None
    configure_access_log(serve)
    from kb_retrieval.engine import KnowledgeLookup
    from kb_retrieval.service.app import create_app
    from kb_retrieval.traces import TraceStore

    lookup = KnowledgeLookup(settings, trace_store=TraceStore.from_settings(settings))
    try:
        app = create_app(lookup, serve)
        settle_heap()
        server = make_server(app, serve)
        _announce(server, serve, settings)
        # uvicorn stops gracefully on SIGTERM and then raises the signal again for its default action, which would
        # end the process before the trace rows are written: here it only says so, and the lookup is closed below.
        previous = signal.signal(signal.SIGTERM, _stopped_by_sigterm)
        try:
            server.run()
        finally:
            signal.signal(signal.SIGTERM, previous)
            discovery.withdraw(settings)  # a lookup started from now on opens the dir itself, once it is free
    finally:
        lookup.close()  # writes every accepted trace row (or logs and counts what the database refused)
        failures = lookup.traces.failures
        print(f"kb-retrieval serve stopped ({failures} trace rows not recorded)", file=sys.stderr, flush=True)
    return 0


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
    )
    return uvicorn.Server(config)


def settle_heap() -> None:
    """Move what the start-up built (the models, indexes and libraries: some 240k objects on the runbooks corpus) out
    of the cyclic collector's reach: it lives as long as the process, and each full collection walked all of it, about
    140 ms once every ~180 lookups on this machine (0.4 ms frozen). Garbage made later is collected as before."""
    gc.collect()
    gc.freeze()


def _stopped_by_sigterm(signum: int, frame: FrameType | None) -> None:
    print("kb-retrieval serve: stopped by SIGTERM (the requests in flight were answered)", file=sys.stderr, flush=True)


#: Where a local client reaches a server listening on every address.
_LOCAL = {"0.0.0.0": "127.0.0.1", "::": "[::1]"}


def _announce(server: uvicorn.Server, serve: ServeSettings, settings: KBSettings) -> None:
    """Say where the server listens once it does (the port is known then, also for ``--port 0``), on stderr and in
    the state dir's ``serve.json``."""
    original = server.startup

    async def startup(sockets: list[Any] | None = None) -> None:
        await original(sockets=sockets)
        urls = []
        for srv in server.servers:
            for sock in srv.sockets:
                url, shown = listening_url(sock.getsockname())
                urls.append(url)
                print(
                    f"kb-retrieval serve: listening on {shown} (collection {settings.collection}; "
                    f"page /, API /v1/lookup, MCP /mcp{'; token required' if serve.token.get_secret_value() else ''})",
                    file=sys.stderr,
                    flush=True,
                )
        if urls:  # `kb-retrieval lookup` on this state dir finds the server here (kb_retrieval.service.discovery)
            discovery.announce(settings, urls[0], token_required=bool(serve.token.get_secret_value()))

    server.startup = startup  # type: ignore[method-assign]


def listening_url(sockname: Any) -> tuple[str, str]:
    """A listening socket's address as ``(the URL a local client uses, the URL as bound)``."""
    host, port = sockname[:2]
    shown = f"[{host}]" if ":" in host else host
    return f"http://{_LOCAL.get(host, shown)}:{port}", f"http://{shown}:{port}"
