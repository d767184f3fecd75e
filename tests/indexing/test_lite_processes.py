"""Several processes and one Milvus Lite data dir: the one-line error for a second process, the shared Lite server
(``milvus-lite server``) that lets several local processes use one data dir, and Lite's loopback gRPC port.

Real processes throughout: a held data dir is a lock held by another process, not something to fake.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from pymilvus import MilvusClient

from kb_retrieval.config import KBSettings
from kb_retrieval.engine import KnowledgeLookup
from kb_retrieval.indexing.index_version import index_version
from kb_retrieval.indexing.l0_index import L0Index
from kb_retrieval.indexing.milvus import MilvusLiteLockedError, connect, is_lite_engine, lite_lock_holder
from kb_retrieval.traces import TraceStore
from tests.conftest import REPO, SAMPLE_KB
from tests.support.kb import offline_env
from tests.support.processes import lite_server as start_lite_server

HOLD = (
    "import sys\n"
    "from kb_retrieval.config import KBSettings\n"
    "from kb_retrieval.indexing.milvus import connect\n"
    "connect(KBSettings(state_dir=sys.argv[1])).list_collections()\n"
    "print('ready', flush=True)\n"
    "sys.stdin.read()\n"
)


def _env() -> dict[str, str]:
    return offline_env(PYTHONPATH=str(REPO))


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    """Another process with the state dir's Milvus Lite data dir open, until the test ends."""
    state = tmp_path / "state"
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(state)],
        cwd=REPO,
        env=_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready", proc.stderr
    try:
        yield proc, state
    finally:
        proc.communicate(timeout=30)  # closing its stdin ends it


def test_second_process_gets_one_clear_line(holder, capfd):
    proc, state = holder
    data_dir = (state / "milvus.db").resolve()
    assert lite_lock_holder(data_dir) == proc.pid
    capfd.readouterr()
    with pytest.raises(MilvusLiteLockedError) as caught:
        connect(KBSettings(state_dir=state))
    message = str(caught.value)
    assert "\n" not in message
    assert f"Milvus Lite data dir {data_dir} is held by process {proc.pid}" in message
    assert f"milvus-lite server --data-dir {data_dir} --host 127.0.0.1" in message
    assert "KB_MILVUS_URI" in message
    assert caught.value.__cause__ is None and caught.value.__suppress_context__
    printed = capfd.readouterr()
    assert "Traceback" not in printed.err + printed.out and "DataDirLockedError" not in printed.err


def test_second_process_cli_prints_one_line_without_traceback(holder):
    _, state = holder
    script = Path(sys.executable).parent / "kb-retrieval"
    run = subprocess.run(
        [str(script), "stats", "--state-dir", str(state)], env=_env(), capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 2
    assert "Traceback" not in run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: Milvus Lite data dir "), run.stderr
    assert "milvus-lite server --data-dir" in lines[0]


def test_lock_is_free_again_once_the_holder_ends(holder):
    proc, state = holder
    proc.communicate(timeout=30)
    assert lite_lock_holder((state / "milvus.db").resolve()) is None
    client = connect(KBSettings(state_dir=state))
    assert client.list_collections() == []


def _listening(pid: int) -> set[tuple[str, int]]:
    return {
        (c.laddr.ip, c.laddr.port)
        for c in psutil.Process(pid).net_connections(kind="inet")
        if c.status == psutil.CONN_LISTEN
    }


def test_embedded_lite_serves_an_unauthenticated_loopback_port(tmp_path):
    """What the README says about Lite's exposure: a gRPC port on 127.0.0.1 only, usable without credentials."""
    before = _listening(os.getpid())
    settings = KBSettings(state_dir=tmp_path / "state")
    connect(settings).create_collection("exposed", dimension=2)
    opened = _listening(os.getpid()) - before
    assert len(opened) == 1, opened
    ((address, port),) = opened
    assert address in ("127.0.0.1", "::ffff:127.0.0.1")
    stranger = MilvusClient(uri=f"http://127.0.0.1:{port}", dedicated=True)  # no token, another connection
    try:
        assert "exposed" in stranger.list_collections()
        stranger.drop_collection("exposed")  # and it may change the data
    finally:
        stranger.close()
    assert not connect(settings).has_collection("exposed")


# --- one data dir shared by several processes through `milvus-lite server` -----------------------------------------


@pytest.fixture
def lite_server(tmp_path: Path) -> Iterator[str]:
    """``milvus-lite server`` on a data dir, loopback only, as the README documents; stopped with Ctrl-C."""
    with start_lite_server(tmp_path / "shared.db") as server:
        port = int(server.uri.rsplit(":", 1)[1])
        assert _listening(server.proc.pid) <= {("127.0.0.1", port), ("::ffff:127.0.0.1", port)}
        yield server.uri


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    script = Path(sys.executable).parent / "kb-retrieval"
    return subprocess.run([str(script), *args], env=_env(), capture_output=True, text=True, timeout=300, cwd=REPO)


@pytest.mark.timeout(600)
def test_several_processes_share_one_lite_data_dir_through_its_server(lite_server, tmp_path, embed_model):
    settings = KBSettings(state_dir=tmp_path / "here", milvus_uri=lite_server, vector_store_mode="sdk")
    ingest = _cli("ingest", str(SAMPLE_KB / "redis"), "--uri", lite_server, "--state-dir", str(tmp_path / "ci"))
    assert ingest.returncode == 0, ingest.stderr
    client = connect(settings)
    assert is_lite_engine(client, settings)  # behind an http URI: FLAT index, flushed after writes
    index = client.describe_index(settings.storage.collection, settings.schema_fields.vector_field)
    assert index["index_type"] == "FLAT"
    before = index_version(client, settings)
    l0 = L0Index.load_from_milvus(client, settings)
    assert l0.enabled and "memory-usage-high.md" in l0.documents and l0.index_version == before
    lookup = KnowledgeLookup(settings, embed_model=embed_model, client=client, trace_store=TraceStore("sqlite://"))
    assert lookup.lookup("RedisMemoryHigh on cache-01").evidence_blocks[0].source == "memory-usage-high.md"
    # Another process looks up while this one holds its client, and a third ingests more.
    other = _cli("lookup", "MySQL replica lag behind source", "--uri", lite_server, "--state-dir", str(tmp_path / "o"))
    assert other.returncode == 0, other.stderr
    more = _cli("ingest", str(SAMPLE_KB / "mysql"), "--uri", lite_server, "--state-dir", str(tmp_path / "ci2"))
    assert more.returncode == 0, more.stderr
    deadline = time.monotonic() + 10
    while index_version(client, settings) == before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert index_version(client, settings) != before
    assert "replication-lag.md" in L0Index.load_from_milvus(client, settings).documents
    # The long-lived lookup of this process sees the other process's ingest (dense, BM25 and L0) without a restart.
    seen = None
    while seen is None and time.monotonic() < deadline + 10:
        result = lookup.lookup("MySQLReplicationLag: replica db-replica-02 is 412 seconds behind its source")
        if result.found and result.evidence_blocks[0].source == "replication-lag.md":
            seen = result
        time.sleep(0.5)
    assert seen is not None, "the running lookup did not see the other process's ingest within 10 s"
    assert "replication-lag.md" in seen.query_transform.hints.matched_sources
    assert any(r.startswith("lexical_bm25") for r in seen.evidence_blocks[0].hit_reasons)
    lookup.close()


@pytest.mark.skipif(os.name != "posix", reason="POSIX file modes")
def test_state_dir_and_lite_data_files_are_the_owners_only_under_umask_022(tmp_path, embed_model):
    """Issue 23 item 8: the Lite files hold the knowledge base's text; as the trace database, 0700 / 0600."""
    import stat

    from kb_retrieval.indexing.ingest import ingest

    old = os.umask(0o022)
    try:
        settings = KBSettings(state_dir=tmp_path / "state" / "kb", vector_store_mode="sdk")
        ingest([SAMPLE_KB / "redis"], settings, embed_model=embed_model)
        lookup = KnowledgeLookup(settings, embed_model=embed_model)
        assert lookup.lookup("Redis memory usage high").found
        lookup.close()
    finally:
        os.umask(old)
    for folder in (tmp_path / "state", settings.storage.state_dir, Path(settings.resolved_milvus_uri())):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
    files = [p for p in Path(settings.resolved_milvus_uri()).rglob("*") if p.is_file()]
    assert files and all(stat.S_IMODE(p.stat().st_mode) & 0o077 == 0 for p in files), [
        (p.name, oct(p.stat().st_mode)) for p in files if p.stat().st_mode & 0o077
    ]
