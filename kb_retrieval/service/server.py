"""``kb-retrieval serve``: build the lookup once, serve it with uvicorn, and drain the traces on the way out.

SIGTERM or Ctrl-C: uvicorn stops accepting connections and waits for the requests in flight, at most
``KB_SERVER_GRACEFUL_SHUTDOWN_S`` (a slow client cannot hold the process: its body must arrive within
``KB_SERVER_BODY_TIMEOUT_S``); the app's lifespan then waits for the lookups on the pool; last, closing the lookup
writes every trace row it accepted (the trace store's drain). A request answered is a row recorded.
"""

from __future__ import annotations

import signal
import socket
import sys
from types import FrameType
from typing import Any

import uvicorn

from kb_retrieval.config import KBSettings
from kb_retrieval.service import discovery
from kb_retrieval.service.serving import configure_access_log, http_stack, listening_url, make_server, settle_heap
from kb_retrieval.service.settings import ServeSettings, is_loopback
from kb_retrieval.service.workers import WorkerStartError, run_workers


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


def _stopped_by_sigterm(signum: int, frame: FrameType | None) -> None:
    print("kb-retrieval serve: stopped by SIGTERM (the requests in flight were answered)", file=sys.stderr, flush=True)


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
                    f"kb-retrieval serve: listening on {shown} (collection {settings.storage.collection}; "
                    f"page /, API /v1/lookup, MCP /mcp; HTTP {http_stack(serve)}"
                    f"{'; token required' if serve.token.get_secret_value() else ''})",
                    file=sys.stderr,
                    flush=True,
                )
        if urls:  # `kb-retrieval lookup` on this state dir finds the server here (kb_retrieval.service.discovery)
            discovery.announce(settings, urls[0], token_required=bool(serve.token.get_secret_value()))

    server.startup = startup  # type: ignore[method-assign]
