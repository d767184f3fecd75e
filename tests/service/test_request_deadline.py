"""Issue 40 item 3: one deadline per request, covering the wait for a worker, for ``/v1/lookup``, each alert of an
Alertmanager payload and MCP ``tools/call``; and the cap on an alert's size (413 naming the limit).

The pipeline is a scripted fake (what is checked is the deadline the server hands it, not retrieval): one worker
thread, the first lookup held until released, so the others wait for the worker. Order of times only, never a
duration; the real pipeline's use of the deadline is tested with Milvus in tests/reliability.
"""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest
from fastapi.testclient import TestClient

from kb_retrieval.config import KBSettings
from kb_retrieval.retrieval.deadline import Deadline
from kb_retrieval.service.app import create_app
from kb_retrieval.service.settings import ServeSettings

pytestmark = pytest.mark.unit
LIMIT_S = 30.0


class _ScriptedLookup:
    """Records the deadline of each lookup; the first one waits for ``release`` (it holds the one worker)."""

    def __init__(self) -> None:
        self.settings = KBSettings(lookup_timeout_s=LIMIT_S, retriever_workers=1)
        self.traces = SimpleNamespace(stored_query=lambda q: q, latest=lambda n: [])
        self.lexical_mode = "milvus_bm25"
        self.index_version = "v"
        self.deadlines: list[tuple[str, Deadline, float]] = []
        self.release = threading.Event()
        self.holding = threading.Event()
        self.lock = threading.Lock()

    def with_settings(self, **overrides):  # pragma: no cover - no overrides in these requests
        raise AssertionError(overrides)

    def lookup(self, query, filters=None, deadline=None):
        with self.lock:
            first = not self.deadlines
            self.deadlines.append((query, deadline, time.monotonic()))
        if first:
            self.holding.set()
            assert self.release.wait(60)
        raise RuntimeError("scripted: no pipeline here")


def _client(fake: _ScriptedLookup, **serve: object) -> TestClient:
    app = create_app(fake, ServeSettings(allowed_hosts="testserver", **serve))  # type: ignore[arg-type]
    return TestClient(app, raise_server_exceptions=False)


def _release_after_others_queue(fake: _ScriptedLookup, others: int) -> None:
    """Release the first lookup once ``others`` more are waiting for the worker (the pool's queue holds them)."""

    def run() -> None:
        assert fake.holding.wait(60)
        time.sleep(0.3)  # the other requests reach the pool's queue meanwhile (order checked below, not this sleep)
        fake.release.set()

    threading.Thread(target=run, daemon=True).start()


def test_each_alert_has_the_payloads_deadline_whatever_it_waited_for_a_worker():
    fake = _ScriptedLookup()
    alerts = [{"labels": {"alertname": f"Alert{i}"}, "annotations": {"summary": f"disk {i} full"}} for i in range(3)]
    with _client(fake) as client:
        _release_after_others_queue(fake, 2)
        before = time.monotonic()
        response = client.post("/v1/alertmanager", json={"alerts": alerts})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["failed"] == 3 and all("scripted" in entry["error"] for entry in body["results"])
    ends = {deadline.ends_at for _, deadline, _ in fake.deadlines}
    assert len(fake.deadlines) == 3 and len(ends) == 1  # one deadline for the payload: arrival + lookup_timeout_s
    (end,) = ends
    assert before + LIMIT_S <= end <= fake.deadlines[0][2] + LIMIT_S
    # The alerts that waited for the worker got what was left of it, not a timeout of their own from their start.
    waited = [entered for _, _, entered in fake.deadlines[1:]]
    assert all(entered > fake.deadlines[0][2] for entered in waited)


def test_a_lookup_request_that_waited_for_the_worker_keeps_its_arrival_deadline():
    fake = _ScriptedLookup()
    with _client(fake) as client:
        _release_after_others_queue(fake, 1)
        arrivals: list[float] = []

        def ask(query: str) -> int:
            arrivals.append(time.monotonic())
            return client.post("/v1/lookup", json={"query": query}).status_code

        first = threading.Thread(target=ask, args=("first",))
        first.start()
        assert fake.holding.wait(60)
        assert ask("second") == 500  # the scripted failure, after the wait
        first.join(60)
    by_query = {query: (deadline, entered) for query, deadline, entered in fake.deadlines}
    deadline, entered = by_query["second"]
    assert deadline.ends_at <= arrivals[1] + LIMIT_S + 0.05  # from its arrival (the route's own clock read)
    assert entered > by_query["first"][1] and deadline.ends_at < entered + LIMIT_S  # not restarted at the worker


def test_an_mcp_call_has_one_deadline_from_its_arrival():
    fake = _ScriptedLookup()
    fake.release.set()
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call"}
    call["params"] = {"name": "lookup_knowledge", "arguments": {"query": "etcd has no leader"}}
    headers = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
    with _client(fake) as client:
        before = time.monotonic()
        response = client.post("/mcp", json=call, headers=headers)
        after = time.monotonic()
    assert response.status_code == 200, response.text
    assert response.json()["result"]["isError"] is True  # the scripted failure, as one line
    ((_, deadline, _),) = fake.deadlines
    assert before + LIMIT_S <= deadline.ends_at <= after + LIMIT_S


def test_an_alert_over_the_size_cap_is_413_naming_the_limit_before_any_lookup():
    fake = _ScriptedLookup()
    fake.release.set()
    alerts = [
        {"labels": {"alertname": "Small"}, "annotations": {"summary": "disk full"}},
        {"labels": {"alertname": "Huge"}, "annotations": {"description": "x" * 5000}},
    ]
    with _client(fake, max_alert_chars=4096) as client:
        response = client.post("/v1/alertmanager", json={"alerts": alerts})
        fitting = client.post("/v1/alertmanager", json={"alerts": alerts[:1]})
    assert response.status_code == 413
    error = response.json()["error"]
    assert "alert 2 (Huge)" in error and "at most 4096" in error and "KB_SERVER_MAX_ALERT_CHARS" in error
    assert "\n" not in error
    assert fitting.status_code == 200
    assert [query for query, _, _ in fake.deadlines] == ["Small: disk full"]  # the refused payload ran nothing
