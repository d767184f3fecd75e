"""What a client sees of the JSON API: ``/openapi.json`` and the status, content type and body of ``POST /v1/lookup``
(and ``/v1/alertmanager``) for well-formed requests and for every kind of refusal (FastAPI's 422 validation errors,
JSON it cannot decode, 400, 413, another content type, query parameters), and which route answers a request.

The app as it runs (``JSONBodyRoute``'s short way on) must answer exactly what FastAPI's own handler answers (the
short way off), body for body and ``/openapi.json`` byte for byte, in the same run: the comparison holds whatever
FastAPI and pydantic versions are installed. What is ours and must not move with them is pinned in a file: each
answer's status, content type and the headers a client acts on (``retry-after``, ``allow``). The pipeline is a fake
that echoes what it was handed (query, overrides, scope): what is checked is the HTTP layer, not retrieval.

After a deliberate change to the API, rewrite the pins with
``KB_REWRITE_PINS=1 .venv/bin/pytest -q tests/service/test_pinned_answers.py`` and review the diff.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from fastapi.testclient import TestClient

from kb_retrieval.config import KBSettings
from kb_retrieval.service import json_body_route
from kb_retrieval.service.app import create_app
from kb_retrieval.service.settings import ServeSettings

pytestmark = pytest.mark.unit
PINS = Path(__file__).with_name("pinned")
REWRITE = os.environ.get("KB_REWRITE_PINS") == "1"
JSON = {"content-type": "application/json"}
MYSQL = {"filters": [{"key": "category", "value": "mysql"}]}
NESTED = {
    "filters": [{"key": "category", "value": ["mysql", "redis"], "operator": "in"}, {**MYSQL, "condition": "or"}],
    "condition": "and",
}

#: (name, path, body bytes, headers, query string): well-formed requests first, then each kind of refusal.
CASES: list[tuple[str, str, bytes, dict[str, str], str]] = [
    ("query", "/v1/lookup", b'{"query": "RedisMemoryHigh on cache-01"}', JSON, ""),
    ("query-unicode", "/v1/lookup", json.dumps({"query": "Über-Latenz \u2013 レプリカ"}).encode(), JSON, ""),
    ("scope", "/v1/lookup", json.dumps({"query": "replica lag", "filters": MYSQL}).encode(), JSON, ""),
    ("scope-nested", "/v1/lookup", json.dumps({"query": "replica lag", "filters": NESTED}).encode(), JSON, ""),
    (
        "overrides",
        "/v1/lookup",
        json.dumps({"query": "disk full", "settings": {"max_evidence_blocks": 3, "lexical_weight": 0.5}}).encode(),
        JSON,
        "",
    ),
    ("charset", "/v1/lookup", b'{"query": "disk full"}', {"content-type": "application/json; charset=utf-8"}, ""),
    ("duplicate-key", "/v1/lookup", b'{"query": "a", "query": "disk full"}', JSON, ""),
    ("whitespace", "/v1/lookup", b' \n{"query": "disk full"}\n ', JSON, ""),
    ("float-int", "/v1/lookup", b'{"query": "disk full", "settings": {"top_k": 10.0}}', JSON, ""),
    ("nan", "/v1/lookup", b'{"query": "disk full", "settings": {"lexical_weight": NaN}}', JSON, ""),
    ("bom", "/v1/lookup", b'\xef\xbb\xbf{"query": "disk full"}', JSON, ""),
    ("utf16", "/v1/lookup", '{"query": "disk full"}'.encode("utf-16"), JSON, ""),
    ("lone-surrogate", "/v1/lookup", b'{"query": "disk \\ud800 full"}', JSON, ""),
    ("missing-query", "/v1/lookup", b"{}", JSON, ""),
    ("empty-query", "/v1/lookup", b'{"query": "  "}', JSON, ""),
    ("query-not-string", "/v1/lookup", b'{"query": 5}', JSON, ""),
    ("unknown-field", "/v1/lookup", b'{"query": "x", "foo": 1}', JSON, ""),
    ("unknown-setting", "/v1/lookup", b'{"query": "x", "settings": {"milvus_uri": "http://elsewhere"}}', JSON, ""),
    ("setting-out-of-range", "/v1/lookup", b'{"query": "x", "settings": {"max_evidence_blocks": -1}}', JSON, ""),
    ("setting-fraction", "/v1/lookup", b'{"query": "x", "settings": {"top_k": 10.5}}', JSON, ""),
    (
        "filter-operator",
        "/v1/lookup",
        b'{"query": "x", "filters": {"filters": [{"key": "a", "value": "b", "operator": "text_match"}]}}',
        JSON,
        "",
    ),
    (
        "filter-value-kinds",
        "/v1/lookup",
        b'{"query": "x", "filters": {"filters": [{"key": "a", "value": ["b", 1]}]}}',
        JSON,
        "",
    ),
    ("filter-not-object", "/v1/lookup", b'{"query": "x", "filters": [1]}', JSON, ""),
    ("too-long", "/v1/lookup", json.dumps({"query": "x" * 5000}).encode(), JSON, ""),
    ("body-null", "/v1/lookup", b"null", JSON, ""),
    ("body-list", "/v1/lookup", b"[]", JSON, ""),
    ("body-empty", "/v1/lookup", b"", JSON, ""),
    ("json-cut", "/v1/lookup", b'{"query": ', JSON, ""),
    ("json-trailing", "/v1/lookup", b'{"query": "x"} x', JSON, ""),
    ("json-raw-newline", "/v1/lookup", b'{"query": "a\nb"}', JSON, ""),
    ("json-not-utf8", "/v1/lookup", b'{"query": "\xff"}', JSON, ""),
    ("json-number-too-long", "/v1/lookup", b'{"query": "x", "settings": {"top_k": 1' + b"0" * 5000 + b"}}", JSON, ""),
    ("json-deep", "/v1/lookup", b'{"query": "x", "filters": ' + b'{"filters": [' * 300 + b"]}" * 300 + b"}", JSON, ""),
    ("no-content-type", "/v1/lookup", b'{"query": "disk full"}', {}, ""),
    ("text-content-type", "/v1/lookup", b'{"query": "disk full"}', {"content-type": "text/plain"}, ""),
    ("json-suffix-type", "/v1/lookup", b'{"query": "disk full"}', {"content-type": "application/vnd.kb+json"}, ""),
    ("over-body-limit", "/v1/lookup", json.dumps({"query": "x" * 70_000}).encode(), JSON, ""),
    ("query-param", "/v1/lookup", b'{"query": "disk full"}', JSON, "full=true"),
    ("query-param-invalid", "/v1/lookup", b'{"query": "disk full"}', JSON, "width=5"),
    ("query-param-and-body-invalid", "/v1/lookup", b"{}", JSON, "view=nope"),
    ("alertmanager-no-alerts", "/v1/alertmanager", b'{"receiver": "kb"}', JSON, ""),
    ("alertmanager-not-json", "/v1/alertmanager", b"{", JSON, ""),
]

#: (name, method, path): which route answers (the order the app tries them in changes none of these).
ROUTING: list[tuple[str, str, str]] = [
    ("get-lookup", "GET", "/v1/lookup"),
    ("post-healthz", "POST", "/healthz"),
    ("get-page-lookup", "GET", "/page/lookup"),
    ("post-page", "POST", "/"),
    ("no-such-route", "POST", "/v1/nowhere"),
    ("page", "GET", "/"),
    ("docs", "GET", "/docs"),
]


class _EchoLookup:
    """Answers a lookup with what it was handed: the query, the overrides its variant was made with, the scope."""

    def __init__(self, overrides: dict[str, Any] | None = None) -> None:
        self.settings = KBSettings()
        self.traces = SimpleNamespace(stored_query=lambda q: q, latest=lambda n: [])
        self.lexical_mode = "milvus_bm25"
        self.index_version = "v"
        self.overrides = overrides or {}

    def with_settings(self, **overrides: Any) -> _EchoLookup:
        return _EchoLookup(overrides)

    def lookup(self, query: str, filters: Any = None, deadline: Any = None) -> Any:
        scope = filters.model_dump(mode="json") if filters is not None else None
        echo = {"query": query, "overrides": self.overrides, "filters": scope}
        return SimpleNamespace(to_json_dict=lambda: echo, evidence_status=SimpleNamespace(value="ok"))


def _answers(short_way: bool, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Every case's answer from a fresh app, with the short way on or off (FastAPI's own handler for everything)."""
    with monkeypatch.context() as patch:
        if not short_way:  # off for as long as the app lives: FastAPI builds an included route's handler late
            patch.setattr(json_body_route._ShortWay, "for_route", classmethod(lambda cls, route: None))
        app = create_app(_EchoLookup(), ServeSettings(access_log=False, max_body_bytes=65_536))  # type: ignore[arg-type]
        answers: dict[str, Any] = {}
        with TestClient(app, base_url="http://127.0.0.1", raise_server_exceptions=False) as client:
            answers["openapi.json"] = client.get("/openapi.json").content.decode()
            for name, path, body, headers, query in CASES:
                response = client.post(f"{path}?{query}" if query else path, content=body, headers=headers)
                answers[name] = _seen(response)
            for name, method, path in ROUTING:
                answers[name] = _seen(client.request(method, path))
    return answers


def _seen(response: Any) -> dict[str, Any]:
    return {
        "status": response.status_code,
        "content-type": response.headers.get("content-type"),
        "retry-after": response.headers.get("retry-after"),
        "allow": response.headers.get("allow"),
        "body": response.content.decode("utf-8", "backslashreplace"),
    }


#: What is pinned of each answer: ours, not the wording of FastAPI's or pydantic's messages.
PINNED = ("status", "content-type", "retry-after", "allow")
#: Cases whose status is FastAPI's choice and moves with its version (0.115 reads a body without a content type as
#: JSON, later releases refuse it with 422): compared with FastAPI's own handler only, not pinned.
FASTAPIS_OWN = {"no-content-type"}


def _check(answers: dict[str, Any], rewrite: bool = False) -> None:
    pinned = PINS / "answers.json"
    cases = {
        name: {key: answer[key] for key in PINNED}
        for name, answer in answers.items()
        if name != "openapi.json" and name not in FASTAPIS_OWN
    }
    if rewrite:
        PINS.mkdir(exist_ok=True)
        pinned.write_text(json.dumps(cases, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    expected = json.loads(pinned.read_text(encoding="utf-8"))
    assert list(cases) == list(expected)
    for name, answer in cases.items():
        assert answer == expected[name], name


def test_fastapis_own_answers_are_the_pinned_ones(monkeypatch):
    _check(_answers(short_way=False, monkeypatch=monkeypatch), rewrite=REWRITE)


def test_the_served_answers_are_fastapis_own_and_took_the_short_way_when_they_could(monkeypatch):
    taken: list[str] = []
    call = json_body_route._ShortWay.call

    async def counted(self: Any, request: Any, body: Any) -> Any:
        taken.append(request.url.path)
        return await call(self, request, body)

    monkeypatch.setattr(json_body_route._ShortWay, "call", counted)
    answers = _answers(short_way=True, monkeypatch=monkeypatch)
    stock = _answers(short_way=False, monkeypatch=monkeypatch)
    assert list(answers) == list(stock)
    for name, answer in answers.items():
        assert answer == stock[name], name  # /openapi.json byte for byte, every answer's body and headers
    _check(answers)
    short = ("query", "query-unicode", "scope", "scope-nested", "overrides", "charset", "duplicate-key", "whitespace")
    assert len(taken) >= len(short) and set(taken) == {"/v1/lookup"}  # the well-formed lookups, nothing else
    assert all(answers[name]["status"] == 200 for name in short)
