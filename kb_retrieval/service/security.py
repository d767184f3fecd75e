"""What every request passes through: the Host / Origin check, the bearer token, the request size limit and
the structured access log.

Plain ASGI middleware, so they guard the MCP endpoint (mounted from the SDK) exactly as they guard the routes.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kb_retrieval.service.settings import is_loopback, split_host

access_log = logging.getLogger("kb_retrieval.access")
#: Paths anyone may read without the token: the page (static, it holds no knowledge-base content) and health.
OPEN_PATHS = frozenset({"/", "/page/app.js", "/healthz"})


async def _send_error(send: Send, status: int, message: str, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    body = json.dumps({"error": message}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
            + (headers or []),
        }
    )
    await send({"type": "http.response.body", "body": body})


class HostCheckMiddleware:
    """DNS rebinding: a page of another site whose name resolves to 127.0.0.1 reaches a loopback server from the
    visitor's browser, but its requests say ``Host: evil.example`` (and ``Origin: http://evil.example``). With
    ``enforced``, every request (the page, ``/healthz``, the API and ``/mcp`` alike) must name a loopback host
    (127.0.0.0/8, ::1, localhost) or one of ``allowed`` in ``Host``, and in ``Origin`` when it sends one; else 421
    (Host) or 403 (Origin). Clients that are not browsers send no Origin."""

    def __init__(self, app: ASGIApp, *, enforced: bool, allowed: frozenset[str]) -> None:
        self.app = app
        self.enforced = enforced
        self.allowed = allowed

    def allows(self, name: str | None) -> bool:
        return bool(name) and (name in self.allowed or is_loopback(name or ""))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or not self.enforced:
            await self.app(scope, receive, send)
            return
        host = origin = None
        for name, value in scope.get("headers", []):
            if name == b"host":
                host = value.decode("latin-1")
            elif name == b"origin":
                origin = value.decode("latin-1")
        if host is None or not self.allows(split_host(host)[0]):
            await _send_error(
                send,
                421,
                "the Host header names another server (a loopback name, or one of KB_SERVER_ALLOWED_HOSTS, is "
                "required: DNS rebinding protection)",
            )
            return
        if origin is not None and not self.allows(_origin_host(origin)):
            await _send_error(
                send,
                403,
                "the Origin header names another site (a loopback one, or one of KB_SERVER_ALLOWED_HOSTS, is "
                "required: DNS rebinding protection)",
            )
            return
        await self.app(scope, receive, send)


def _origin_host(origin: str) -> str | None:
    """The host of an ``Origin`` header (``None`` for ``null`` or anything unreadable)."""
    try:
        return urlsplit(origin.strip()).hostname
    except ValueError:
        return None


class BearerTokenMiddleware:
    """With a token configured, every request but ``OPEN_PATHS`` must say ``Authorization: Bearer <token>``;
    compared with ``hmac.compare_digest`` (constant time). Without a token the middleware lets everything through
    (the server then listens on loopback only: ``serve`` refuses anything else)."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self._token = token.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self._token or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        given = b""
        for name, value in scope.get("headers", []):
            if name == b"authorization" and value[:7].lower() == b"bearer ":
                given = value[7:].strip()
        if not hmac.compare_digest(given, self._token):
            await _send_error(
                send,
                401,
                "missing or wrong bearer token (Authorization: Bearer ...)",
                [(b"www-authenticate", b"Bearer")],
            )
            return
        await self.app(scope, receive, send)


class BodyLimitMiddleware:
    """Reads the whole body before the app sees the request: over ``max_bytes`` is 413 (at once by its
    ``Content-Length``, else as soon as a chunked body passes it), not all received within ``timeout_s`` is 408. A
    client sending one byte now and then holds neither a worker nor the server's shutdown, and no route starts on a
    body it cannot finish reading."""

    def __init__(self, app: ASGIApp, max_bytes: int, timeout_s: float = 10.0) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        too_large = f"request body over {self.max_bytes} bytes (KB_SERVER_MAX_BODY_BYTES)"
        for name, value in scope.get("headers", []):
            if name == b"content-length" and value.isdigit() and int(value) > self.max_bytes:
                await _send_error(send, 413, too_large)
                return
        body = bytearray()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        while True:
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - loop.time()))
            except TimeoutError:
                message = {"type": "timeout"}
            if message["type"] == "timeout":
                await _send_error(
                    send, 408, f"request body not received within {self.timeout_s:g} s (KB_SERVER_BODY_TIMEOUT_S)"
                )
                return
            if message["type"] != "http.request":  # the client went away: nothing to answer
                return
            body += message.get("body", b"")
            if len(body) > self.max_bytes:
                await _send_error(send, 413, too_large)
                return
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()  # after the body: the wait for a disconnect, as the app would have made it

        await self.app(scope, replay, send)


class AccessLogMiddleware:
    """One JSON line per request: method, path (never its query string), status, milliseconds, client address.

    A route may add fields to ``scope["state"]["access"]`` (``/v1/lookup`` adds the query). The query is logged as
    the trace store keeps it (its ``stored_query``): in full, as ``sha256:...`` or as its length
    (``KB_TRACE_QUERY``), so a ``hash`` or ``redact`` deployment never writes query text to its logs either.
    """

    def __init__(self, app: ASGIApp, stored_query: Callable[[str], str]) -> None:
        self.app = app
        self.logged_query = stored_query  # the trace store's own (TraceStore.stored_query): one rule for both

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        extra: dict[str, Any] = {}
        scope.setdefault("state", {})["access"] = extra
        if not access_log.isEnabledFor(logging.INFO):  # KB_SERVER_ACCESS_LOG=false: no line to time or write
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def recording_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, recording_send)
        finally:
            client = scope.get("client")
            entry: dict[str, Any] = {
                "method": scope.get("method"),
                "path": scope.get("path"),
                "status": status,
                "ms": round((time.perf_counter() - started) * 1000, 2),
                "client": f"{client[0]}:{client[1]}" if client else None,
            }
            for key, value in extra.items():
                entry[key] = self.logged_query(value) if key == "query" and isinstance(value, str) else value
            access_log.info(json.dumps(entry, ensure_ascii=False))
