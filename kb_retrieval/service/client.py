"""What ``kb-retrieval lookup --server URL`` sends: one ``POST /v1/lookup`` per query, standard library only.

Loads no LlamaIndex, Milvus or model, so a lookup through a running server costs a process start and one HTTP
round trip. The token (``KB_SERVER_TOKEN``) goes in the ``Authorization`` header and is never printed.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any
from urllib.parse import urlsplit

#: Seconds to wait for a server's answer (a lookup under load, the first one after a start).
TIMEOUT_S = 60.0


class ServerError(Exception):
    """The server could not be reached, or it refused the request: one line saying which and why."""


class LookupClient:
    """A client of one server. ``text=True`` asks for the agent's text instead of the result JSON.

    Example:
        >>> client = LookupClient("http://127.0.0.1:8765")
        >>> client.lookup_json("etcd has no leader")["found"]  # doctest: +SKIP
        True
    """

    def __init__(self, url: str, token: str = "", timeout_s: float = TIMEOUT_S) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ServerError(f"server URL must be http://host:port or https://host:port, got {url!r}")
        self.base = url.rstrip("/")
        self._token = token
        self.timeout_s = timeout_s

    def _post(self, path: str, payload: dict[str, Any], accept: str) -> bytes:
        headers = {"content-type": "application/json", "accept": accept}
        if self._token:
            headers["authorization"] = f"Bearer {self._token}"
        request = urllib.request.Request(
            self.base + path, data=json.dumps(payload).encode(), headers=headers, method="POST"
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                body: bytes = response.read()
                return body
        except urllib.error.HTTPError as exc:
            raise ServerError(f"server {self.base} answered {exc.code}: {_error_text(exc.read())}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ServerError(f"cannot reach the kb-retrieval server at {self.base}: {reason}") from None

    def lookup_json(self, query: str, *, filters: dict[str, Any] | None = None) -> dict[str, Any]:
        """The result JSON of one lookup, as the server sent it (key order kept).

        ``filters``: the lookup's scope as LlamaIndex's MetadataFilters JSON (``MetadataFilters.model_dump()``), e.g.
        ``{"filters": [{"key": "category", "value": "mysql", "operator": "=="}]}``; a bad one is a ``ServerError``
        naming it."""
        body = _request_body(query, filters)
        data: dict[str, Any] = json.loads(self._post("/v1/lookup", body, "application/json"))
        return data

    def lookup_text(
        self, query: str, *, full: bool = False, width: int | None = None, filters: dict[str, Any] | None = None
    ) -> str:
        """What ``kb-retrieval lookup`` prints without ``--json`` for one lookup (the person's view); ``filters`` as
        for :meth:`lookup_json`."""
        params = {"view": "terminal", **({"full": "true"} if full else {}), **({"width": str(width)} if width else {})}
        path = "/v1/lookup?" + urllib.parse.urlencode(params)
        return self._post(path, _request_body(query, filters), "text/plain").decode("utf-8")


def _request_body(query: str, filters: dict[str, Any] | None) -> dict[str, Any]:
    return {"query": query, **({"filters": filters} if filters is not None else {})}


def _error_text(body: bytes) -> str:
    try:
        data = json.loads(body)
    except ValueError:
        return body.decode("utf-8", "replace").strip()[:300] or "(no message)"
    return str(data.get("error", data)) if isinstance(data, dict) else str(data)
