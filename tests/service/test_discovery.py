"""``kb-retrieval lookup`` on a state dir that ``serve`` holds answers through that server, with no flag; a file a
server left behind, or one naming a process that does not hold the dir, is ignored."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kb_retrieval.bench.serve import ServeProcess
from kb_retrieval.config import KBSettings
from kb_retrieval.indexing.lite_lock import LITE_LOCK_FILE
from kb_retrieval.service.discovery import SERVE_FILE, announce, find_server, serve_file, withdraw
from tests.conftest import REPO
from tests.service.conftest import REDIS_ALERT, without_timings
from tests.support.cli_probe import cli_env, lookup_in_fresh_process

pytestmark = pytest.mark.timeout(600)


def test_lookup_on_a_held_state_dir_goes_through_its_server(state_copy, tmp_path: Path) -> None:
    state = state_copy("discovery")
    server = ServeProcess(state, tmp_path / "serve.log", args=["--mode", "sdk"]).start()
    try:
        record = json.loads((state / SERVE_FILE).read_text())
        assert record["url"] == server.url and record["pid"] == server.proc.pid
        assert not (state / SERVE_FILE).stat().st_mode & 0o077
        # No --server, no KB_SERVER_URL: the dir is held (a lookup in this process could not open it), and the
        # probe shows no pipeline was loaded, so the answer came from the server.
        run = lookup_in_fresh_process(["--state-dir", str(state), "--json", REDIS_ALERT])
        direct = subprocess.run(
            [sys.executable, "-m", "kb_retrieval.cli", "lookup", "--server", server.url, "--json", REDIS_ALERT],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=REPO,
            env=cli_env(),
        )
        assert without_timings(json.loads(run.stdout)) == without_timings(json.loads(direct.stdout))
    finally:
        assert server.stop() == 0, server.log()[-3000:]
    assert not (state / SERVE_FILE).exists()  # withdrawn on the way out


@pytest.fixture
def held(tmp_path: Path) -> Iterator[KBSettings]:
    """A state dir whose Lite data dir this process holds the way Milvus Lite does (an exclusive flock)."""
    settings = KBSettings(state_dir=tmp_path / "state")
    data_dir = Path(settings.resolved_milvus_uri())
    data_dir.mkdir(parents=True)
    fd = os.open(data_dir / LITE_LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        yield settings
    finally:
        os.close(fd)


@pytest.mark.unit
def test_the_holder_of_the_lock_is_found(held: KBSettings) -> None:
    assert find_server(held) is None  # no file
    announce(held, "http://127.0.0.1:9", token_required=True)
    found = find_server(held)
    assert found is not None and (found.url, found.pid, found.token_required) == (
        "http://127.0.0.1:9",
        os.getpid(),
        True,
    )
    assert find_server(held.model_copy(update={"collection": "other"})) is None  # it serves another collection
    withdraw(held)
    assert not serve_file(held).exists()


@pytest.mark.unit
def test_a_file_naming_a_process_that_does_not_hold_the_dir_is_ignored(held: KBSettings, tmp_path: Path) -> None:
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    record = {"url": "http://127.0.0.1:9", "pid": int(gone.stdout), "collection": held.storage.collection, "milvus": ""}
    serve_file(held).write_text(json.dumps(record))
    assert find_server(held) is None  # a server killed without cleaning up
    withdraw(held)
    assert serve_file(held).exists()  # not this process's file: left alone
    free = KBSettings(state_dir=tmp_path / "free")
    announce(free, "http://127.0.0.1:9", token_required=False)
    assert find_server(free) is None  # this process names itself but holds no lock on that dir
    for broken in ("{", "[]", json.dumps({**record, "pid": "1"})):
        serve_file(held).write_text(broken)
        assert find_server(held) is None


@pytest.mark.unit
def test_a_server_wanting_a_token_is_named_without_one(held: KBSettings, capsys, monkeypatch) -> None:
    from kb_retrieval.cli import main

    announce(held, "http://127.0.0.1:9", token_required=True)
    for name in ("KB_SERVER_URL", "KB_SERVER_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    assert main(["lookup", "--state-dir", str(held.storage.state_dir), "disk full"]) == 2
    said = capsys.readouterr().err
    assert f"held by kb-retrieval serve (pid {os.getpid()}) at http://127.0.0.1:9, which wants a token" in said
