"""DNS rebinding: a loopback server answers only requests whose Host (and Origin, when sent) is a loopback name or
one of ``KB_SERVER_ALLOWED_HOSTS``, on every route, ``/mcp`` included, at any loopback address."""

from __future__ import annotations

import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from kb_retrieval.bench.serve import ServeProcess
from kb_retrieval.service.security import HostCheckMiddleware
from kb_retrieval.service.settings import ServeSettings, split_host

EVIL = {"host": "evil.example:18766", "origin": "http://evil.example:18766"}
MCP_CALL = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "tools/call",
    "params": {"name": "lookup_knowledge", "arguments": {"query": "redis memory high"}},
}
MCP_HEADERS = {"accept": "application/json, text/event-stream"}
#: Every route, with a request that would answer 200 from a loopback client.
ROUTES = [
    ("GET", "/", None),
    ("GET", "/healthz", None),
    ("GET", "/v1/traces?limit=1", None),
    ("POST", "/v1/lookup", {"query": "redis memory high"}),
    ("POST", "/v1/alertmanager", {"alerts": [{"labels": {"alertname": "RedisMemoryHigh"}}]}),
    ("POST", "/mcp", MCP_CALL),
]


def _client(settings: ServeSettings) -> TestClient:
    app = Starlette(routes=[Route("/", lambda _: PlainTextResponse("ok"))])
    checked = HostCheckMiddleware(app, enforced=settings.checks_host(), allowed=settings.allowed_host_names())
    return TestClient(checked, base_url="http://127.0.0.1")


@pytest.mark.unit
@pytest.mark.parametrize(
    ("bind", "allowed", "headers", "status"),
    [
        ("127.0.0.1", "", {}, 200),
        ("127.0.0.1", "", {"host": "localhost:8765", "origin": "http://127.0.0.1:8765"}, 200),
        ("127.0.0.2", "", {"host": "127.0.0.2:8765"}, 200),
        ("::1", "", {"host": "[::1]:8765", "origin": "http://[::1]:8765"}, 200),
        ("127.0.0.1", "", {"host": "evil.example:8765"}, 421),
        ("127.0.0.2", "", {"host": "evil.example"}, 421),
        ("127.0.0.1", "", {"origin": "http://evil.example:8765"}, 403),
        ("127.0.0.1", "", {"origin": "null"}, 403),
        ("127.0.0.1", "", {"host": "127.0.0.1.evil.example"}, 421),
        ("127.0.0.1", "kb.example.org", {"host": "kb.example.org", "origin": "https://KB.example.org"}, 200),
        ("127.0.0.1", "kb.example.org, other.example", {"host": "evil.example"}, 421),
        # Another bind relies on its token, unless names are allowed: then those (and the address itself).
        ("10.0.0.5", "", {"host": "evil.example"}, 200),
        ("10.0.0.5", "kb.example.org", {"host": "evil.example"}, 421),
        ("10.0.0.5", "kb.example.org", {"host": "10.0.0.5:8765"}, 200),
    ],
)
def test_host_and_origin_must_name_this_server(bind, allowed, headers, status):
    response = _client(ServeSettings(host=bind, allowed_hosts=allowed)).get("/", headers=headers)
    assert response.status_code == status
    if status != 200:
        assert "DNS rebinding" in response.json()["error"]


@pytest.mark.unit
def test_split_host_reads_names_ports_and_ipv6():
    assert split_host("[::1]:8765") == ("::1", "8765")
    assert split_host("EVIL.example") == ("evil.example", "")
    assert split_host("::1") == ("::1", "")


def _request(url: str, method: str, path: str, body: object, headers: dict[str, str]) -> httpx.Response:
    return httpx.request(method, url + path, json=body, headers={**MCP_HEADERS, **headers}, timeout=120)


@pytest.mark.timeout(600)
def test_a_rebound_name_is_refused_on_every_route_of_a_running_server(served):
    for method, path, body in ROUTES:
        refused = _request(served.url, method, path, body, EVIL)
        assert refused.status_code == 421, (path, refused.text)
        assert "DNS rebinding" in refused.json()["error"] and "Traceback" not in refused.text
        origin_only = _request(served.url, method, path, body, {"origin": EVIL["origin"]})
        assert origin_only.status_code == 403, (path, origin_only.text)
        answered = _request(served.url, method, path, body, {"origin": served.url})
        assert answered.status_code == 200, (path, answered.text)


@pytest.mark.timeout(600)
def test_another_loopback_address_is_checked_too_and_the_allow_list_lets_a_proxy_name_in(state_copy, tmp_path):
    server = ServeProcess(
        state_copy("host-check"),
        tmp_path / "serve.log",
        args=["--mode", "sdk", "--host", "127.0.0.2"],
        env={"KB_SERVER_ALLOWED_HOSTS": "kb.example.org"},
    )
    server.url = f"http://127.0.0.2:{server.port}"
    with server:
        refused = _request(server.url, "POST", "/mcp", MCP_CALL, {"host": "evil.example"})
        assert refused.status_code == 421, refused.text
        proxied = _request(
            server.url, "POST", "/mcp", MCP_CALL, {"host": "kb.example.org", "origin": "https://kb.example.org"}
        )
        assert proxied.status_code == 200, proxied.text
        assert proxied.json()["result"]["isError"] is False
        direct = _request(server.url, "GET", "/v1/traces?limit=1", None, {})
        assert direct.status_code == 200 and direct.json()["rows"][0]["query"] == "redis memory high"
    assert server.proc is not None and server.proc.returncode == 0, server.log()[-3000:]
