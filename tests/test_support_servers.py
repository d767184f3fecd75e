"""The test servers themselves: a real Milvus standalone server, and PostgreSQL by URL."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from pymilvus import DataType, MilvusClient
from sqlalchemy import create_engine, text

from tests.support import postgres
from tests.support.milvus_server import ETCD_PEER, MilvusServer

# The fixtures milvus_server and postgres_url come from tests.support.fixtures, loaded by tests/conftest.py.

DIM = 8
CATEGORIES = ("redis", "kafka", "postgres", "nginx")


def _unit(vector: list[float]) -> list[float]:
    norm = sum(x * x for x in vector) ** 0.5
    return [x / norm for x in vector]


def _rows(count: int, seed: int = 7) -> list[dict[str, object]]:
    rng = random.Random(seed)
    return [
        {
            "id": i,
            "category": CATEGORIES[i % len(CATEGORIES)],
            "embedding": _unit([rng.uniform(-1.0, 1.0) for _ in range(DIM)]),
        }
        for i in range(count)
    ]


def _create_cosine_flat_collection(client: MilvusClient, name: str) -> None:
    schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
    schema.add_field("id", DataType.INT64, is_primary=True)
    schema.add_field("category", DataType.VARCHAR, max_length=64)
    schema.add_field("embedding", DataType.FLOAT_VECTOR, dim=DIM)
    index_params = client.prepare_index_params()
    index_params.add_index(field_name="embedding", index_type="FLAT", metric_type="COSINE")
    client.create_collection(name, schema=schema, index_params=index_params, consistency_level="Strong")


def _count(client: MilvusClient, name: str) -> int:
    result = client.query(name, filter="", output_fields=["count(*)"], consistency_level="Strong")
    return int(result[0]["count(*)"])


def _running(pid: int) -> bool:
    """A process that still runs (a zombie has exited: it only waits for its parent to reap it)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _processes_naming(data_dir: Path) -> list[psutil.Process]:
    """Running processes whose command line names ``data_dir`` (the wrapper's --data, DIR/bin/milvus)."""
    marker = str(data_dir)
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info.get("cmdline") or []
        if proc.pid != os.getpid() and any(marker in part for part in cmdline) and _running(proc.pid):
            found.append(proc)
    return found


def _assert_nothing_left(server: MilvusServer, pids: set[int]) -> None:
    deadline = time.monotonic() + 10
    while any(_running(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert [pid for pid in pids if _running(pid)] == [], "a process of the stopped server still runs"
    assert _processes_naming(server.data_dir) == [], "a process naming the server's data dir still runs"
    assert server.leftover_processes() == []


@contextlib.contextmanager
def _client(uri: str) -> Iterator[MilvusClient]:
    client = MilvusClient(uri=uri, timeout=30)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def client(milvus_server: MilvusServer) -> Iterator[MilvusClient]:
    with _client(milvus_server.uri) as client:
        yield client


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[MilvusServer]:
    """A server of the test's own, for stopping and restarting; the shared one keeps running meanwhile."""
    server = MilvusServer(tmp_path / "milvus")
    try:
        yield server
    finally:
        server.stop()


# ---------------------------------------------------------------------------------------------- Milvus


@pytest.mark.server
@pytest.mark.timeout(300)
def test_server_answers_on_its_own_ports(milvus_server: MilvusServer, client: MilvusClient) -> None:
    assert milvus_server.running
    assert milvus_server.uri == f"http://127.0.0.1:{milvus_server.proxy_port}"
    assert isinstance(client.list_collections(), list)
    assert client.get_server_version().startswith("v2.3")

    tree = milvus_server.process_tree()
    assert len(tree) >= 2, "the milvus-server wrapper and its 'milvus run standalone' child"
    listening: set[int] = set()
    for proc in tree:
        for conn in proc.net_connections(kind="tcp"):
            if conn.status == psutil.CONN_LISTEN:
                listening.add(conn.laddr.port)
    chosen = set(milvus_server.ports.values()) | {milvus_server.metrics_port}
    assert milvus_server.proxy_port in listening
    assert milvus_server.ports["etcd-port"] in listening and milvus_server.ports[ETCD_PEER] in listening
    assert listening <= chosen, f"listening on ports nobody chose: {sorted(listening - chosen)}"
    assert not listening & {2379, 2380, 19530}, "etcd's or Milvus's default ports would collide"


@pytest.mark.server
@pytest.mark.timeout(300)
def test_cosine_flat_collection_insert_and_search(client: MilvusClient) -> None:
    name = f"support_{uuid.uuid4().hex[:10]}"
    rows = _rows(200)
    _create_cosine_flat_collection(client, name)
    try:
        index = client.describe_index(name, index_name="embedding")
        assert index["index_type"] == "FLAT" and index["metric_type"] == "COSINE"
        assert client.insert(name, rows)["insert_count"] == len(rows)
        assert _count(client, name) == len(rows)

        query = rows[42]["embedding"]
        hits = client.search(
            name,
            data=[query],
            anns_field="embedding",
            limit=5,
            search_params={"metric_type": "COSINE"},
            output_fields=["category"],
            consistency_level="Strong",
        )[0]
        assert hits[0]["id"] == 42
        assert hits[0]["distance"] == pytest.approx(1.0, abs=1e-4), "COSINE: a similarity, 1.0 for itself"
        distances = [hit["distance"] for hit in hits]
        assert distances == sorted(distances, reverse=True), "COSINE: higher is better"

        filtered = client.search(
            name,
            data=[query],
            anns_field="embedding",
            limit=5,
            filter='category == "kafka"',
            search_params={"metric_type": "COSINE"},
            output_fields=["category"],
            consistency_level="Strong",
        )[0]
        assert filtered and all(hit["entity"]["category"] == "kafka" for hit in filtered)
        assert 42 not in {hit["id"] for hit in filtered}  # row 42 is "postgres"
    finally:
        client.drop_collection(name)


@pytest.mark.server
@pytest.mark.timeout(300)
def test_stop_ends_the_whole_process_tree(milvus_server: MilvusServer, own_server: MilvusServer) -> None:
    own_server.start()
    assert set(own_server.ports.values()).isdisjoint(milvus_server.ports.values())
    assert [p.name() for p in own_server.process_tree()].count("milvus") == 1
    pids = set(own_server.pids)
    assert len(pids) >= 2

    own_server.stop()

    assert not own_server.running
    _assert_nothing_left(own_server, pids)
    # The shared server, started first and still running, was not touched.
    with _client(milvus_server.uri) as other:
        assert isinstance(other.list_collections(), list)


@pytest.mark.server
@pytest.mark.timeout(300)
def test_stop_ends_milvus_even_when_the_wrapper_died_first(own_server: MilvusServer) -> None:
    """SIGTERM to milvus-server alone leaves 'milvus run standalone' running: stop() still ends it."""
    own_server.start()
    pids = set(own_server.pids)
    wrapper_pid = own_server.pid
    assert wrapper_pid is not None
    os.kill(wrapper_pid, signal.SIGTERM)
    time.sleep(1.0)
    orphans = [pid for pid in pids if pid != wrapper_pid and _running(pid)]
    assert orphans, "the Milvus child outlives its wrapper (the reason stop() ends children by PID)"

    own_server.stop()

    _assert_nothing_left(own_server, pids)


@pytest.mark.server
@pytest.mark.timeout(300)
def test_restart_on_the_same_data_dir_keeps_rows_and_uri(own_server: MilvusServer) -> None:
    own_server.start()
    uri = own_server.uri
    rows = _rows(300, seed=11)
    with _client(uri) as client:
        _create_cosine_flat_collection(client, "survivor")
        client.insert("survivor", rows)  # not flushed: the restart must replay it from the server's log
        assert _count(client, "survivor") == len(rows)
    first_pids = set(own_server.pids)

    own_server.stop()
    _assert_nothing_left(own_server, first_pids)
    own_server.start()

    assert own_server.uri == uri, "a restart keeps the ports, so clients keep their uri"
    assert own_server.pids.isdisjoint(first_pids)
    with _client(uri) as client:
        assert "survivor" in client.list_collections()
        client.load_collection("survivor")
        assert _count(client, "survivor") == len(rows)
        hits = client.search(
            "survivor",
            data=[rows[7]["embedding"]],
            anns_field="embedding",
            limit=1,
            search_params={"metric_type": "COSINE"},
            consistency_level="Strong",
        )[0]
        assert hits[0]["id"] == 7


# ---------------------------------------------------------------------------------------------- PostgreSQL


def test_postgres_url_reads_the_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(postgres.ENV_VAR, raising=False)
    assert postgres.postgres_url() is None
    monkeypatch.setenv(postgres.ENV_VAR, "  ")
    assert postgres.postgres_url() is None
    monkeypatch.setenv(postgres.ENV_VAR, "postgresql+psycopg://kb:pw@127.0.0.1:5433/kb")
    assert postgres.postgres_url() == "postgresql+psycopg://kb:pw@127.0.0.1:5433/kb"
    monkeypatch.setenv(postgres.ENV_VAR, "postgresql://kb:pw@127.0.0.1:5433/kb")
    assert postgres.postgres_url() == "postgresql+psycopg://kb:pw@127.0.0.1:5433/kb"
    assert postgres.ENV_VAR in postgres.NOT_SET_MESSAGE and "not set" in postgres.NOT_SET_MESSAGE


@pytest.mark.postgres
def test_postgres_url_accepts_a_connection(postgres_url: str) -> None:
    engine = create_engine(postgres_url)
    try:
        with engine.connect() as conn:
            assert conn.execute(text("SELECT 1")).scalar_one() == 1
            assert conn.execute(text("SHOW server_version")).scalar_one()
        with engine.begin() as conn:
            conn.execute(text("CREATE TEMPORARY TABLE kb_support_probe (id integer PRIMARY KEY, note text)"))
            conn.execute(text("INSERT INTO kb_support_probe VALUES (1, 'written')"))
            note = conn.execute(text("SELECT note FROM kb_support_probe WHERE id = 1")).scalar_one()
            assert note == "written"
    finally:
        engine.dispose()
