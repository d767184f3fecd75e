"""The same ingest and lookup against a real Milvus standalone server (started by the tests)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from pymilvus import DataType

from kb_retrieval.config import KBSettings
from kb_retrieval.engine import KnowledgeLookup
from kb_retrieval.indexing.embeddings import embed_query
from kb_retrieval.indexing.index_version import index_version
from kb_retrieval.indexing.ingest import ingest
from kb_retrieval.indexing.l0_index import L0Index
from kb_retrieval.indexing.milvus import QUERY_WINDOW, connect, ensure_side_collection, is_lite_engine, iter_rows
from tests.conftest import REPO, SAMPLE_KB
from tests.support.kb import LATER_DOC, offline_env, write_kb

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def server_settings(milvus_server, tmp_path_factory, embed_model) -> KBSettings:
    settings = KBSettings(
        state_dir=tmp_path_factory.mktemp("server-state"), milvus_uri=milvus_server.uri, collection="kb_server_test"
    )
    first = ingest([SAMPLE_KB / "redis", SAMPLE_KB / "mysql"], settings, embed_model=embed_model)
    assert first.chunks_added > 0
    return settings


def test_rerun_on_server_writes_nothing(server_settings, embed_model):
    again = ingest([SAMPLE_KB / "redis", SAMPLE_KB / "mysql"], server_settings, embed_model=embed_model)
    assert (again.chunks_added, again.chunks_updated, again.chunks_removed, again.chunks_embedded) == (0, 0, 0, 0)


@pytest.mark.parametrize("mode", ["sdk", "vectorstore", "auto"])
def test_lookup_on_server(server_settings, embed_model, mode):
    lookup = KnowledgeLookup(server_settings.model_copy(update={"vector_store_mode": mode}), embed_model=embed_model)
    result = lookup.lookup("RedisMemoryHigh: memory above 90% of maxmemory on cache-01")
    assert result.found and result.evidence_blocks[0].source == "memory-usage-high.md"
    assert result.query_transform.category_filter == "redis"
    assert result.retrieval_trace.attempts[0].filter_expr == 'category == "redis"'
    assert result.retrieval_trace.path_served == ("sdk" if mode == "sdk" else "vectorstore")
    assert {b.category for b in result.evidence_blocks} == {"redis"}


def test_crafted_category_filter_on_server(server_settings, embed_model):
    lookup = KnowledgeLookup(server_settings.model_copy(update={"vector_store_mode": "sdk"}), embed_model=embed_model)
    from kb_retrieval.indexing.embeddings import embed_query

    embedding = embed_query(embed_model, "replication")
    for crafted in ['redis" or category != "', "mysql' || 1==1", 'x\\" or true or \\"']:
        assert lookup.dense.search(embedding, crafted).candidates == []
    assert lookup.dense.search(embedding, "mysql").candidates


# --- Milvus state on a server: the index, the L0 index for every host, concurrent ingests, the index version -------

#: Runs one ingest in its own process once told to: the model is loaded first, so two of them start their writes
#: within milliseconds of each other.
INGEST_ON_GO = (
    "import sys, time\n"
    "from pathlib import Path\n"
    "from kb_retrieval.config import KBSettings\n"
    "from kb_retrieval.indexing.embeddings import load_embed_model\n"
    "from kb_retrieval.indexing.ingest import ingest\n"
    "model = load_embed_model()\n"
    "settings = KBSettings(state_dir=sys.argv[1], milvus_uri=sys.argv[2], collection=sys.argv[3])\n"
    "print('ready', flush=True)\n"
    "while not Path(sys.argv[4]).exists():\n"
    "    time.sleep(0.01)\n"
    "summary = ingest([sys.argv[5]], settings, embed_model=model)\n"
    "print(summary.documents_added, flush=True)\n"
)


def _process_env() -> dict[str, str]:
    return offline_env(PYTHONPATH=str(REPO))


def test_new_server_collection_gets_hnsw_and_session_consistency(server_settings):
    client = connect(server_settings)
    index = client.describe_index(server_settings.storage.collection, server_settings.schema_fields.vector_field)
    assert (index["index_type"], index["M"], index["efConstruction"]) == ("HNSW", "16", "200")
    assert client.describe_collection(server_settings.storage.collection)["consistency_level"] == 1  # Session
    assert not is_lite_engine(client, server_settings)


def test_index_type_and_params_are_configurable(milvus_server, tmp_path, embed_model):
    settings = KBSettings(
        state_dir=tmp_path / "state",
        milvus_uri=milvus_server.uri,
        collection="kb_server_ivf",
        index_type="IVF_FLAT",
        index_params={"nlist": 64},
    )
    ingest([SAMPLE_KB / "network"], settings, embed_model=embed_model)
    index = connect(settings).describe_index(settings.storage.collection, settings.schema_fields.vector_field)
    assert (index["index_type"], index["nlist"]) == ("IVF_FLAT", "64")
    lookup = KnowledgeLookup(settings.model_copy(update={"vector_store_mode": "sdk"}), embed_model=embed_model)
    assert lookup.lookup("conntrack table full, dropping packets").evidence_blocks[0].source == (
        "conntrack-table-full.md"
    )


def test_a_host_that_never_ingested_reads_the_same_l0_index(server_settings, tmp_path):
    host_b = KBSettings(
        state_dir=tmp_path / "empty-state",
        milvus_uri=server_settings.storage.milvus_uri,
        collection=server_settings.storage.collection,
    )
    l0_b = L0Index.load_from_milvus(connect(host_b), host_b)
    l0_a = L0Index.load(server_settings.l0_index_path())  # the copy the ingesting host wrote
    assert l0_b.enabled and l0_b.documents == l0_a.documents and l0_b.content_hash == l0_a.content_hash
    assert {"redis", "mysql"} <= {e.category for e in l0_b.documents.values()}
    assert not host_b.l0_index_path().exists()


@pytest.mark.timeout(600)
def test_two_ingests_at_once_keep_both_l0_entries(milvus_server, tmp_path, embed_model):
    """Issue 14 item 8: two processes ingest two folders into one collection (one state dir) at the same moment."""
    settings = KBSettings(state_dir=tmp_path / "state", milvus_uri=milvus_server.uri, collection="kb_server_concurrent")
    ingest([SAMPLE_KB / "jvm"], settings, embed_model=embed_model)  # the collection exists; its first version
    first = index_version(connect(settings), settings)
    go = tmp_path / "go"
    args = [str(settings.storage.state_dir), milvus_server.uri, settings.storage.collection, str(go)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", INGEST_ON_GO, *args, str(SAMPLE_KB / folder)],
            cwd=REPO,
            env=_process_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for folder in ("kubernetes", "linux")
    ]
    for proc in procs:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    go.touch()
    outputs = [proc.communicate(timeout=300) for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], [err[-2000:] for _, err in outputs]
    assert [out.strip() for out, _ in outputs] == ["7", "7"]
    client = connect(settings)
    l0 = L0Index.load_from_milvus(client, settings)
    expected = {p.name for folder in ("jvm", "kubernetes", "linux") for p in (SAMPLE_KB / folder).glob("*.md")}
    assert set(l0.documents) == expected
    chunk_sources = {
        row[settings.schema_fields.source_field]
        for row in iter_rows(client, settings, [settings.schema_fields.source_field])
    }
    assert chunk_sources == expected
    assert index_version(client, settings) not in ("", first)


@pytest.mark.timeout(600)
def test_index_version_shows_another_process_ingest(milvus_server, tmp_path, embed_model):
    settings = KBSettings(state_dir=tmp_path / "reader", milvus_uri=milvus_server.uri, collection="kb_server_version")
    ingest([SAMPLE_KB / "jvm"], settings, embed_model=embed_model)
    reader = connect(settings)
    before = index_version(reader, settings)
    assert before

    def other_process_ingests(*folders: str) -> None:
        command = [str(Path(sys.executable).parent / "kb-retrieval"), "ingest", *folders, "--json"]
        command += ["--uri", milvus_server.uri, "--collection", settings.storage.collection]
        command += ["--state-dir", str(tmp_path / "writer")]
        run = subprocess.run(command, env=_process_env(), capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr[-2000:]

    other_process_ingests(str(SAMPLE_KB / "jvm"), str(SAMPLE_KB / "network"))
    deadline = time.monotonic() + 10
    while index_version(reader, settings) == before and time.monotonic() < deadline:
        time.sleep(0.1)
    after = index_version(reader, settings)
    assert after != before
    other_process_ingests(str(SAMPLE_KB / "jvm"), str(SAMPLE_KB / "network"))  # nothing to write
    time.sleep(1)  # well past the server's time tick
    assert index_version(reader, settings) == after


def test_iter_rows_reads_every_row_in_one_query_or_pages(milvus_server, tmp_path, monkeypatch):
    """A small collection in one strong query (Milvus 2.3's iterator waits a time tick per page); a large one by
    the query iterator; every row either way."""
    settings = KBSettings(state_dir=tmp_path, milvus_uri=milvus_server.uri, collection="kb_server_rows")
    client = connect(settings)

    def fields(schema):
        schema.add_field("key", DataType.VARCHAR, is_primary=True, max_length=64)

    ensure_side_collection(client, settings, settings.storage.collection, fields)
    pages = []
    real_iterator = client.query_iterator
    monkeypatch.setattr(client, "query_iterator", lambda *a, **k: pages.append(1) or real_iterator(*a, **k))
    for total in (50, QUERY_WINDOW // 2 + 500):
        client.upsert(settings.storage.collection, [{"key": f"k{i:05d}", "vector": [0.0, 0.0]} for i in range(total)])
        keys = [row["key"] for row in iter_rows(client, settings, ["key"])]
        assert len(keys) == len(set(keys)) == total
        assert len(pages) == (0 if total == 50 else 1)


HOST_QUERIES = [
    "RedisMemoryHigh: memory above 90% of maxmemory on cache-01",
    "MySQLReplicationLag: replica db-replica-02 is 412 seconds behind",
    "replica reports master_link_status:down after a network blip",
    "how do I find the slow queries on a MySQL primary",
]


def test_a_second_host_with_an_empty_state_dir_gets_the_same_evidence(server_settings, tmp_path, embed_model):
    """Issue 13: ingest on host A; lookups from host B (nothing local) against the same server answer alike."""
    host_a = server_settings.model_copy(update={"vector_store_mode": "sdk"})
    host_b = host_a.model_copy(update={"state_dir": tmp_path / "host-b"})
    lookup_a = KnowledgeLookup(host_a, embed_model=embed_model)
    lookup_b = KnowledgeLookup(host_b, embed_model=embed_model)
    for query in HOST_QUERIES:
        a, b = lookup_a.lookup(query), lookup_b.lookup(query)
        assert [(x.source, x.hit_reasons) for x in a.evidence_blocks] == [
            (x.source, x.hit_reasons) for x in b.evidence_blocks
        ], query
        assert a.query_transform.category_filter == b.query_transform.category_filter, query
        assert a.query_transform.hints == b.query_transform.hints, query
    assert any(lookup_b.lookup(q).query_transform.category_filter for q in HOST_QUERIES)  # L0 filters reached B
    assert not (tmp_path / "host-b" / "l0").exists()
    lookup_a.close()
    lookup_b.close()


@pytest.mark.timeout(600)
def test_a_long_lived_lookup_sees_another_process_ingest_on_the_server(milvus_server, tmp_path, embed_model):
    """Issue 13: another process ingests a new document; the running lookup finds it within 10 s, no restart."""
    settings = KBSettings(
        state_dir=tmp_path / "reader",
        milvus_uri=milvus_server.uri,
        collection="kb_server_fresh",
        vector_store_mode="sdk",
        freshness_check_s=1,
    )
    ingest([SAMPLE_KB / "redis"], settings, embed_model=embed_model)
    lookup = KnowledgeLookup(settings, embed_model=embed_model)
    query = "ZorkQuuxSpindleJammed on frobnicator-7"
    assert "ZorkQuuxSpindleJammed" not in lookup.lookup(query).query_transform.hints.matched_keywords
    kb = write_kb(tmp_path / "kb", LATER_DOC)
    writer = subprocess.run(  # another process, its own state dir
        [sys.executable, "-m", "kb_retrieval.cli", "ingest", str(kb), "--uri", milvus_server.uri,
         "--collection", "kb_server_fresh", "--state-dir", str(tmp_path / "writer")],
        capture_output=True, text=True, timeout=300, cwd=REPO,
        env=offline_env(),
    )  # fmt: skip
    assert writer.returncode == 0, writer.stderr[-2000:]
    ingested = time.monotonic()
    while True:
        result = lookup.lookup(query)
        if result.found and result.evidence_blocks[0].source == "frobnicator/spindle-jammed.md":
            break
        assert time.monotonic() - ingested < 10, "the running lookup did not see the other process's ingest"
        time.sleep(0.5)
    assert "ZorkQuuxSpindleJammed" in result.query_transform.hints.matched_keywords  # L0 reloaded
    assert any(r.startswith("lexical_bm25") for r in result.evidence_blocks[0].hit_reasons)  # BM25 reloaded
    lookup.close()


def test_server_without_full_text_search_falls_back_to_in_process_bm25(server_settings, embed_model):
    """Milvus 2.3 has no BM25 function: the collection is made without one, and BM25 runs in process, named in
    the trace, in the query notes and in ``stats``; exact-identifier candidates still come (a second search)."""
    from kb_retrieval.indexing.milvus import engine_has_full_text, full_text_off

    lookup = KnowledgeLookup(server_settings.model_copy(update={"vector_store_mode": "sdk"}), embed_model=embed_model)
    assert not engine_has_full_text(lookup.client, lite=False)
    assert full_text_off(lookup.client, lookup.settings) is not None
    assert lookup.lexical_mode == "in_process_bm25" and lookup.lexical is not None
    result = lookup.lookup("RedisMemoryHigh: memory above 90% of maxmemory on cache-01")
    assert result.found and result.evidence_blocks[0].source == "memory-usage-high.md"
    attempt = result.retrieval_trace.attempts[0]
    assert attempt.lexical_mode == "in_process_bm25" and attempt.lexical_count > 0
    # The dense search (ids and scores) and beside it the read of BM25's hits by key; after it the read of the rows
    # of dense hits that read had not kept.
    assert attempt.milvus_calls in (2, 3)
    assert any(note.startswith("milvus_bm25 off: ") for note in result.query_transform.notes)
    lookup.close()


def test_in_process_bm25_on_the_server_gives_what_two_searches_in_a_row_gave(server_settings, embed_model):
    """The read by key goes out beside the dense search (one round trip), later searches score those chunks from
    their kept vectors, and the candidates are those of a second search after the dense one, restricted to the
    chunks it missed, with the server's scores to float32 precision (computed here from the vectors read)."""
    from tests.retrieval.test_hybrid_in_process import QUERIES, SlowSearches, two_searches_in_a_row

    lookup = KnowledgeLookup(
        server_settings.model_copy(update={"vector_store_mode": "sdk", "freshness_check_s": 3600}),
        embed_model=embed_model,
    )
    assert lookup.lexical_mode == "in_process_bm25" and lookup.plan == "milvus"
    for top_k in (20, 2):
        narrow = lookup.with_settings(top_k=top_k)
        for query in QUERIES:
            for category in (None, "redis"):
                embedding = embed_query(embed_model, query)
                expected, added = two_searches_in_a_row(narrow.hybrid, embedding, query, category)
                found = narrow.hybrid.search(embedding, query, category)
                assert [c.chunk_id for c in found.candidates] == [c.chunk_id for c in expected]
                for got, want in zip(found.candidates, expected, strict=True):
                    assert (got.score, got.similarity) == pytest.approx((want.score, want.similarity), abs=1e-6)
                assert found.lexical_added == added
    query = "RedisMemoryHigh: used_memory above maxmemory, keys evicted"
    narrow = lookup.with_settings(top_k=2)  # nothing kept yet but the rows of the dense hits
    embedding = embed_query(embed_model, query)
    narrow.dense.search(embedding, kept=narrow.hybrid.kept)
    slow = SlowSearches(narrow.client, delay_s=0.3)
    try:
        found = narrow.hybrid.search(embedding, query, None)
    finally:
        slow.restore()
    assert sorted(slow.names) == ["dense", "read"] and found.milvus_calls == 2 and found.lexical_added > 0
    (a_start, a_end), (b_start, b_end) = slow.spans
    assert a_start < b_end and b_start < a_end  # the two requests were out at the same time
    lookup.close()
