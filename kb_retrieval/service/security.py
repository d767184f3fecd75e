"""What every request passes through: the bearer token, the request size limit and the structured access log.

Plain ASGI middleware, so they guard the MCP endpoint (mounted from the SDK) exactly as they guard the routes.
"""

from __future__ import annotations

import hmac
import json
import logging
import time
from collections.abc import Callable
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

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


class BodyTooLargeError(Exception):
    pass


class BodyLimitMiddleware:
    """Refuses a body over ``max_bytes`` with 413: at once by its ``Content-Length``, else while it streams in."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", []):
            if name == b"content-length" and value.isdigit() and int(value) > self.max_bytes:
                await _send_error(send, 413, f"request body over {self.max_bytes} bytes (KB_SERVER_MAX_BODY_BYTES)")
                return
        received = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise BodyTooLargeError
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except BodyTooLargeError:
            if not started:
                await _send_error(send, 413, f"request body over {self.max_bytes} bytes (KB_SERVER_MAX_BODY_BYTES)")


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
        started = time.perf_counter()
        status = 500
        extra: dict[str, Any] = {}
        scope.setdefault("state", {})["access"] = extra

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
