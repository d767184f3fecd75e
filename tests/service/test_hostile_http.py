"""Hostile requests to a running server: text that is not Unicode, bodies the framework cannot parse, chunked bodies
over the limit, slow senders, a full admission; each answered with one JSON ``{"error": ...}`` and the right status,
and an Alertmanager batch in which one bad alert gets its own error entry while the others answer."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import threading
import time

import httpx
import pytest

from kb_retrieval.bench.serve import ServeProcess
from kb_retrieval.service.security import BodyLimitMiddleware
from tests.service.conftest import REDIS_ALERT

pytestmark = pytest.mark.timeout(600)


def assert_error(response: httpx.Response, status: int, *fragments: str) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert list(body) == ["error"], body
    assert "\n" not in body["error"] and "Traceback" not in response.text
    for fragment in fragments:
        assert fragment in body["error"], body["error"]
    return str(body["error"])


def raw_post(url: str, body: bytes) -> httpx.Response:
    return httpx.post(url, content=body, headers={"content-type": "application/json"}, timeout=120)


def test_a_lone_surrogate_is_422_naming_it(served):
    response = raw_post(served.url + "/v1/lookup", b'{"query": "disk \\ud800 full"}')
    assert_error(response, 422, "lone surrogate", "U+D800")
    paired = raw_post(served.url + "/v1/lookup", b'{"query": "disk full \\ud83d\\ude00"}')  # a pair is one character
    assert paired.status_code == 200, paired.text


def test_one_bad_alert_gets_its_own_error_while_the_batch_answers(served):
    alerts = [
        {"labels": {"alertname": "RedisMemoryHigh"}, "annotations": {"summary": "Redis memory above 90%"}},
        {"labels": {"alertname": "DiskFull"}, "annotations": {"summary": "disk \ud800 full"}},
        {"labels": {"alertname": "KubePodCrashLooping"}, "annotations": {"summary": "pod restarts (CrashLoopBackOff)"}},
    ]
    body = json.dumps({"alerts": alerts}).encode()  # ASCII JSON: the lone surrogate travels as its \\ud800 escape
    assert b"\\ud800" in body
    response = raw_post(served.url + "/v1/alertmanager", body)
    assert response.status_code == 200, response.text
    payload = response.json()
    assert (payload["alerts"], payload["looked_up"], payload["failed"]) == (3, 2, 1)
    redis, disk, kube = payload["results"]
    assert redis["result"]["found"] and kube["result"]["found"]
    assert disk["result"] is None and "lone surrogate" in disk["error"] and disk["alertname"] == "DiskFull"


@pytest.mark.parametrize(
    ("body", "status"),
    [
        (b'{"query": "disk \xff\xfe full"}', 400),  # not UTF-8
        (b'{"query": ' + b"[" * 5000 + b"]" * 5000 + b"}", 400),  # nested deeper than any parser's recursion
        (b'{"query": "q", "settings": {"top_k": ' + b"9" * 5000 + b"}}", 400),  # a 5,000-digit integer
    ],
    ids=["invalid-utf8", "deep-nesting", "huge-integer"],
)
def test_bodies_the_parser_refuses_are_one_error_shape(served, body, status):
    assert_error(raw_post(served.url + "/v1/lookup", body), status, "cannot be read as JSON")


def test_framework_errors_are_the_one_error_shape(served):
    assert_error(httpx.get(served.url + "/no/such/route", timeout=30), 404, "no such route")
    assert_error(httpx.get(served.url + "/v1/lookup", timeout=30), 405, "GET")


def test_a_chunked_body_over_the_limit_is_413(served):
    def chunks():
        for _ in range(40):
            yield b"x" * 50_000  # 2 MB in all, over the 1 MB default; no Content-Length: chunked

    response = httpx.post(
        served.url + "/v1/lookup", content=chunks(), headers={"content-type": "application/json"}, timeout=60
    )
    assert_error(response, 413, "KB_SERVER_MAX_BODY_BYTES")


@pytest.mark.unit
def test_a_body_not_received_in_time_is_408_and_the_app_never_runs():
    ran = []
    sent: list[dict] = []

    async def app(scope, receive, send):
        ran.append(scope["path"])

    async def never(*_):
        await asyncio.sleep(3600)

    async def record(message):
        sent.append(message)

    middleware = BodyLimitMiddleware(app, max_bytes=1000, timeout_s=0.05)
    asyncio.run(middleware({"type": "http", "path": "/v1/lookup", "headers": []}, never, record))
    assert not ran
    assert sent[0]["status"] == 408
    assert "KB_SERVER_BODY_TIMEOUT_S" in json.loads(sent[1]["body"])["error"]


@pytest.mark.unit
def test_a_batch_that_does_not_fit_is_refused_before_any_lookup_runs():
    from kb_retrieval.service.runner import BusyError, LookupRunner

    runner = LookupRunner.__new__(LookupRunner)  # admission only: no pipeline needed
    runner.max_pending = 3
    runner._pending = 0
    runner._pending_lock = threading.Lock()
    with runner.admitted(2):
        with pytest.raises(BusyError, match="nothing was run"), runner.admitted(2):
            pass
        assert runner._pending == 2
        with runner.admitted(1):
            assert runner._pending == 3
    assert runner._pending == 0


def _slow_sender(port: int, stop: threading.Event, progress: list[int]) -> None:
    """A client that announces a 10 KB body and sends it one byte every 0.2 s until told to stop."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(
            b"POST /v1/lookup HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\n"
            b"content-length: 10000\r\n\r\n{"
        )
        while not stop.is_set():
            try:
                sock.sendall(b" ")
            except OSError:
                return  # the server closed the connection
            progress.append(1)
            time.sleep(0.2)


def test_sigterm_is_not_held_by_a_slow_client_and_answered_lookups_keep_their_rows(state_copy, tmp_path):
    server = ServeProcess(
        state_copy("slow-client"),
        tmp_path / "serve.log",
        args=["--mode", "sdk"],
        env={"KB_SERVER_BODY_TIMEOUT_S": "600", "KB_SERVER_GRACEFUL_SHUTDOWN_S": "1"},
    ).start()
    stop = threading.Event()
    progress: list[int] = []
    sender = threading.Thread(target=_slow_sender, args=(server.port, stop, progress), daemon=True)
    try:
        answered = httpx.post(server.url + "/v1/lookup", json={"query": REDIS_ALERT}, timeout=120)
        assert answered.status_code == 200
        sender.start()
        while len(progress) < 3:  # the slow request is in flight
            time.sleep(0.1)
        assert server.proc is not None
        server.proc.send_signal(signal.SIGTERM)
        code = server.proc.wait(timeout=300)
        sender.join(timeout=60)  # the server closed its connection: sending fails
        assert not sender.is_alive() and len(progress) < 9_999  # the process ended before the client's body did
    finally:
        stop.set()
        server.stop()
    assert code == 0, server.log()[-3000:]
    assert "(0 trace rows not recorded)" in server.log()
    from kb_retrieval.traces import TraceStore

    store = TraceStore(f"sqlite:///{server.state_dir / 'traces.db'}")
    try:
        assert [row.query for row in store.rows()] == [REDIS_ALERT]
    finally:
        store.close()


@pytest.mark.unit
@pytest.mark.parametrize("token", ["   ", "\t", " real-token "])
def test_a_blank_or_padded_token_is_refused(tmp_path, capsys, monkeypatch, token):
    from kb_retrieval.cli import main

    monkeypatch.setenv("KB_SERVER_TOKEN", token)
    assert main(["serve", "--host", "0.0.0.0", "--state-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "KB_SERVER_TOKEN" in err and "whitespace" in err
    assert "real-token" not in err
    assert not (tmp_path / "milvus.db").exists()


def test_terminal_controls_in_a_file_name_are_shown_escaped(in_process):
    from kb_retrieval.terminal import lookup_text

    result = in_process.lookup(REDIS_ALERT)
    block = result.evidence_blocks[0]
    block.source = "\x1b[31mRED\x1b[0m.md\nforged: line"
    block.title = "title \u202eevil"
    text = lookup_text(result, in_process.settings.scoring, full=True)
    assert "\x1b" not in text and "\u202e" not in text
    assert "\\x1b[31mRED\\x1b[0m.md\\x0aforged: line" in text and "\\u202e" in text
    assert not any(line.startswith("forged") for line in text.splitlines())


@pytest.mark.unit
def test_a_port_in_use_is_exit_3_in_one_line_before_anything_loads(tmp_path, capsys, monkeypatch):
    from kb_retrieval.cli import main
    from kb_retrieval.cli.serve import EXIT_ADDRESS_IN_USE

    monkeypatch.delenv("KB_SERVER_TOKEN", raising=False)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        code = main(["serve", "--port", str(port), "--state-dir", str(tmp_path)])
    assert code == EXIT_ADDRESS_IN_USE == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"port {port}" in err and "in use" in err
    assert not (tmp_path / "milvus.db").exists()


class _FakeLookup:
    """A pipeline whose answers are scripted: ``statuses`` in order; ``gate`` holds a lookup until set."""

    def __init__(self, statuses: list[str]) -> None:
        from kb_retrieval.config import KBSettings

        self.settings = KBSettings()
        self.statuses = statuses
        self.calls = 0
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()

    def lookup(self, query, filters=None, deadline=None):
        from types import SimpleNamespace

        self.calls += 1
        self.entered.set()
        self.gate.wait(60)
        return SimpleNamespace(evidence_status=SimpleNamespace(value=self.statuses.pop(0)))


@pytest.mark.unit
def test_once_milvus_failed_one_lookup_probes_it_and_the_others_fail_fast(monkeypatch):
    from kb_retrieval.service import runner as runner_module
    from kb_retrieval.service.runner import LookupRunner, MilvusDownError

    monkeypatch.setattr(runner_module, "FAIL_FAST_S", 3600.0)
    fake = _FakeLookup(["knowledge_base_unavailable", "ok", "ok"])
    runner = LookupRunner(fake, workers=2, max_pending=8)  # type: ignore[arg-type]
    try:
        now = time.monotonic
        assert runner._lookup("q", {}, None, now()).evidence_status.value == "knowledge_base_unavailable"
        fake.gate.clear()
        fake.entered.clear()
        probe = runner.pool.submit(runner._lookup, "q", {}, None, now())  # the one lookup that checks Milvus
        assert fake.entered.wait(60)
        with pytest.raises(MilvusDownError, match="knowledge_base_unavailable"):
            runner._lookup("q", {}, None, now())  # not started: the pipeline is not called
        assert fake.calls == 2
        fake.gate.set()
        assert probe.result(60).evidence_status.value == "ok"  # Milvus is back
        assert runner._lookup("q", {}, None, now()).evidence_status.value == "ok" and fake.calls == 3
    finally:
        fake.gate.set()
        runner.close()
