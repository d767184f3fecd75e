"""Incremental, idempotent ingest into Milvus Lite with the real embedding model."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from pymilvus import MilvusClient

from kb_retrieval.config import KBSettings
from kb_retrieval.indexing.embeddings import word_piece_limit
from kb_retrieval.indexing.ingest import WINDOW_BATCHES, _DocPlan, _Writer, ingest
from kb_retrieval.indexing.l0_index import L0Index
from kb_retrieval.indexing.milvus import MilvusUnavailableError, SchemaMismatchError, connect
from kb_retrieval.knowledge.chunker import chunk_document
from kb_retrieval.knowledge.loader import KnowledgeBaseError, load_knowledge_base
from tests.support.kb import write_kb

DOC_A = """---
title: Redis memory usage high
keywords: [RedisMemoryHigh, maxmemory]
category: redis
entities: [redis-cli]
---
# Redis memory usage high

## Diagnosis
Run `redis-cli INFO memory` and compare used_memory with maxmemory.

## Mitigation
Raise maxmemory or pick an eviction policy.
"""
DOC_B = "# MySQL replication lag\n\n## Diagnosis\nCheck Seconds_Behind_Source in SHOW REPLICA STATUS.\n"


def rows(settings: KBSettings) -> dict[str, dict]:
    client = connect(settings)
    client.load_collection(settings.storage.collection)
    found = client.query(
        settings.storage.collection, filter='source != ""', output_fields=["source", "category", "metadata"]
    )
    return {r["id"]: r for r in found}


@pytest.fixture
def settings(tmp_path: Path) -> KBSettings:
    return KBSettings(state_dir=tmp_path / "state")


def test_first_ingest_then_rerun_touches_nothing(tmp_path, settings, embed_model):
    kb = write_kb(tmp_path / "kb", {"redis/memory.md": DOC_A, "mysql/lag.md": DOC_B})
    first = ingest([kb], settings, embed_model=embed_model)
    assert (first.documents, first.documents_added) == (2, 2)
    assert first.chunks_added == first.chunks_embedded == len(rows(settings)) > 2
    second = ingest([kb], settings, embed_model=embed_model)
    assert (second.chunks_added, second.chunks_updated, second.chunks_removed, second.chunks_embedded) == (0, 0, 0, 0)
    assert second.chunks_unchanged == first.chunks_added


def test_rows_carry_scalar_fields_and_metadata(tmp_path, settings, embed_model):
    kb = write_kb(tmp_path / "kb", {"redis/memory.md": DOC_A, "mysql/lag.md": DOC_B})
    ingest([kb], settings, embed_model=embed_model)
    by_source = {r["source"]: r for r in rows(settings).values()}
    redis = by_source["redis/memory.md"]
    assert redis["category"] == "redis"
    assert redis["metadata"]["title"] == "Redis memory usage high"
    assert redis["metadata"]["keywords"] == ["RedisMemoryHigh", "maxmemory"]
    assert redis["metadata"]["breadcrumb"].startswith("Redis memory usage high")
    mysql = by_source["mysql/lag.md"]  # no frontmatter: title from H1, category from the folder
    assert mysql["category"] == "mysql" and mysql["metadata"]["title"] == "MySQL replication lag"


def test_edit_replaces_old_chunks_and_delete_removes(tmp_path, settings, embed_model):
    kb = write_kb(tmp_path / "kb", {"redis/memory.md": DOC_A, "mysql/lag.md": DOC_B})
    ingest([kb], settings, embed_model=embed_model)
    old_ids = {i for i, r in rows(settings).items() if r["source"] == "redis/memory.md"}
    (kb / "redis/memory.md").write_text(DOC_A.replace("Raise maxmemory", "Lower the dataset or raise maxmemory"))
    edited = ingest([kb], settings, embed_model=embed_model)
    assert edited.documents_updated == 1 and edited.documents_unchanged == 1
    now = rows(settings)
    new_ids = {i for i, r in now.items() if r["source"] == "redis/memory.md"}
    assert new_ids and not (new_ids & old_ids)
    # Issue 14 item 15: the edited document's old chunks are replaced, not removed; its new ones are updated.
    assert (edited.chunks_updated, edited.chunks_replaced, edited.chunks_removed) == (len(new_ids), len(old_ids), 0)
    lag_ids = {i for i, r in now.items() if r["source"] == "mysql/lag.md"}
    (kb / "mysql/lag.md").unlink()
    deleted = ingest([kb], settings, embed_model=embed_model)
    assert deleted.documents_removed == 1
    assert (deleted.chunks_removed, deleted.chunks_replaced, deleted.chunks_updated) == (len(lag_ids), 0, 0)
    assert {r["source"] for r in rows(settings).values()} == {"redis/memory.md"}
    assert "mysql/lag.md" not in L0Index.load(settings.l0_index_path()).documents


def test_two_folders_side_by_side(tmp_path, settings, embed_model):
    a = write_kb(tmp_path / "a", {"redis/memory.md": DOC_A})
    b = write_kb(tmp_path / "b", {"mysql/lag.md": DOC_B})
    ingest([a], settings, embed_model=embed_model)
    ingest([b], settings, embed_model=embed_model)
    assert {r["source"] for r in rows(settings).values()} == {"redis/memory.md", "mysql/lag.md"}
    (a / "redis/memory.md").unlink()
    write_kb(a, {"redis/other.md": DOC_A.replace("RedisMemoryHigh", "RedisOther")})
    ingest([a], settings, embed_model=embed_model)  # removes only a's deleted document
    assert {r["source"] for r in rows(settings).values()} == {"redis/other.md", "mysql/lag.md"}
    assert set(L0Index.load(settings.l0_index_path()).documents) == {"redis/other.md", "mysql/lag.md"}


def test_same_source_from_two_folders_is_an_error(tmp_path, settings, embed_model):
    a = write_kb(tmp_path / "a", {"redis/memory.md": DOC_A})
    b = write_kb(tmp_path / "b", {"redis/memory.md": DOC_A})
    with pytest.raises(KnowledgeBaseError, match=r"redis/memory\.md"):
        ingest([a, b], settings, embed_model=embed_model)
    assert not settings.l0_index_path().exists()  # nothing written
    ingest([a], settings, embed_model=embed_model)
    with pytest.raises(KnowledgeBaseError, match="already in collection"):
        ingest([b], settings, embed_model=embed_model)


def test_different_documents_at_one_path_under_two_roots_both_kept(tmp_path, settings, embed_model, caplog):
    # Each corpus's own SOURCE.txt (or each docs tree's index.md): two documents, one relative path.
    a = write_kb(tmp_path / "a", {"redis/memory.md": DOC_A, "SOURCE.txt": "Copied from the redis runbooks repository."})
    b = write_kb(tmp_path / "b", {"mysql/lag.md": DOC_B, "SOURCE.txt": "Derived from the MySQL alert rules."})
    first = ingest([a, b], settings, embed_model=embed_model)
    assert first.documents_added == 4
    sources = {r["source"]: r["metadata"]["kb"] for r in rows(settings).values()}
    # The first root keeps plain paths (a root ingested alone never changes ids); the other's is qualified.
    assert set(sources) == {"redis/memory.md", "SOURCE.txt", "mysql/lag.md", "b/SOURCE.txt"}
    assert sources["SOURCE.txt"] == a.resolve().as_posix()
    assert sources["b/SOURCE.txt"] == b.resolve().as_posix()
    assert "source ids prefixed 'b/' (b/SOURCE.txt)" in caplog.text
    assert set(L0Index.load(settings.l0_index_path()).documents) == set(sources)
    # Its chunk ids are those of its qualified id (chunk ids derive from the source id).
    renamed = next(d for d in load_knowledge_base(b).documents if d.source_id == "SOURCE.txt")
    renamed.source_id = "b/SOURCE.txt"
    chunking, limit = settings.chunking, word_piece_limit(settings.embedding.embed_model)
    expected = {c.chunk_id for c in chunk_document(renamed, chunking.chunk_tokens, chunking.chunk_overlap, limit)}
    assert {i for i, r in rows(settings).items() if r["source"] == "b/SOURCE.txt"} == expected
    # Stable: each root again, alone or together, in any order, touches nothing.
    for again in ([b], [a], [b, a]):
        summary = ingest(again, settings, embed_model=embed_model)
        assert (summary.documents_added, summary.documents_updated, summary.chunks_removed) == (0, 0, 0), again
    assert {r["source"] for r in rows(settings).values()} == set(sources)
    # An edit of the qualified document updates it in place.
    (b / "SOURCE.txt").write_text("Derived from the MySQL alert rules, 2026 edition.", encoding="utf-8")
    summary = ingest([b], settings, embed_model=embed_model)
    assert summary.documents_updated == 1
    assert {r["source"] for r in rows(settings).values()} == set(sources)


def test_shared_path_whose_qualified_id_is_taken_is_an_error(tmp_path, settings, embed_model):
    a = write_kb(tmp_path / "a", {"index.md": DOC_A})
    b = write_kb(tmp_path / "b", {"index.md": DOC_B, "b/index.md": DOC_B.replace("lag", "delay")})
    with pytest.raises(KnowledgeBaseError, match=r"'index\.md' is under two roots .* 'b/index\.md' is taken"):
        ingest([a, b], settings, embed_model=embed_model)
    assert not settings.l0_index_path().exists()  # nothing written


def test_bad_files_are_skipped_and_counted(tmp_path, settings, embed_model):
    kb = write_kb(
        tmp_path / "kb",
        {"redis/memory.md": DOC_A, "bad/broken.md": "---\ntitle: [unclosed\n---\n# x\n", "bad/empty.md": "  \n"},
    )
    (kb / "bad/binary.md").write_bytes(b"\x89PNG\x00\x00binary")
    summary = ingest([kb], settings, embed_model=embed_model)
    assert summary.documents == 1 and summary.skipped_files == 3
    reasons = {s.source: s.reason for s in summary.skipped}
    assert "frontmatter" in reasons["bad/broken.md"] and "empty" in reasons["bad/empty.md"]
    assert "binary" in reasons["bad/binary.md"]


def test_missing_folder_is_a_clear_error(tmp_path, settings, embed_model):
    with pytest.raises(KnowledgeBaseError, match="not found"):
        ingest([tmp_path / "nope"], settings, embed_model=embed_model)


def test_schema_mismatch_is_an_error_before_writing(tmp_path, settings, embed_model):
    kb = write_kb(tmp_path / "kb", {"redis/memory.md": DOC_A})
    ingest([kb], settings, embed_model=embed_model)
    before = len(rows(settings))
    for change, message in (({"dim": 768}, "dimension 384, expected 768"), ({"metric": "L2"}, "metric is COSINE")):
        with pytest.raises(SchemaMismatchError, match=message):
            ingest([kb], settings.model_copy(update=change), embed_model=embed_model)
    with pytest.raises(SchemaMismatchError, match=r"missing field 'body'"):
        ingest([kb], settings.model_copy(update={"content_field": "body"}), embed_model=embed_model)
    assert len(rows(settings)) == before


def test_unreachable_server_fails_within_seconds(tmp_path, embed_model):
    kb = write_kb(tmp_path / "kb", {"redis/memory.md": DOC_A})
    settings = KBSettings(state_dir=tmp_path / "state", milvus_uri="http://127.0.0.1:9", milvus_timeout_s=3)
    started = time.monotonic()
    with pytest.raises(MilvusUnavailableError, match=r"127\.0\.0\.1:9"):
        ingest([kb], settings, embed_model=embed_model)
    assert time.monotonic() - started < 10
    assert not settings.l0_index_path().exists()


class FailingAfter:
    """Wraps the model and raises after ``n`` batches: an interrupted ingest."""

    def __init__(self, model, n: int) -> None:
        self.model, self.n = model, n

    def get_text_embedding_batch(self, texts):
        if self.n == 0:
            raise KeyboardInterrupt("interrupted")
        self.n -= 1
        return self.model.get_text_embedding_batch(texts)


def test_interrupted_ingest_converges(tmp_path, embed_model):
    docs = {f"redis/doc{i}.md": DOC_A.replace("RedisMemoryHigh", f"RedisAlert{i}") for i in range(24)}
    kb = write_kb(tmp_path / "kb", docs)
    clean = KBSettings(state_dir=tmp_path / "clean", embed_batch_size=1)
    ingest([kb], clean, embed_model=embed_model)
    assert len(rows(clean)) > 2 * WINDOW_BATCHES
    broken = KBSettings(state_dir=tmp_path / "broken", embed_batch_size=1)
    with pytest.raises(KeyboardInterrupt):
        # Ingest writes every WINDOW_BATCHES model batches: fail in the second window, the first one's write in flight.
        ingest([kb], broken, embed_model=FailingAfter(embed_model, WINDOW_BATCHES))
    partial = len(rows(broken))
    assert 0 < partial < len(rows(clean))
    resumed = ingest([kb], broken, embed_model=embed_model)
    assert resumed.chunks_embedded == len(rows(clean)) - partial  # only what was missing
    assert set(rows(broken)) == set(rows(clean))
    assert json.loads(broken.l0_index_path().read_text()) == json.loads(clean.l0_index_path().read_text())


def test_existing_client_reads_what_ingest_wrote(tmp_path, settings, embed_model):
    kb = write_kb(tmp_path / "kb", {"redis/memory.md": DOC_A})
    ingest([kb], settings, embed_model=embed_model)
    client = MilvusClient(settings.resolved_milvus_uri())
    assert client.get_collection_stats(settings.storage.collection)["row_count"] == len(rows(settings))


class FixedModel:
    """A stand-in encoder (one fixed vector a text): pins the writer's logic without the model."""

    def get_text_embedding_batch(self, texts):
        return [[1.0, 0.0, 0.0]] * len(texts)


class SlowClient:
    """Records the writes; each upsert takes a while (a write still in flight when more work is queued) and fails
    with ``error`` when given."""

    def __init__(self, error: Exception | None = None) -> None:
        self.events: list[str] = []
        self.error = error

    def upsert(self, collection, rows):
        time.sleep(0.3)
        if self.error is not None:
            raise self.error
        self.events.append(f"upsert {len(rows)}")

    def delete(self, collection, ids):
        self.events.append(f"delete {len(ids)}")


def _one_plan(tmp_path: Path) -> _DocPlan:
    doc = load_knowledge_base(write_kb(tmp_path / "kb", {"redis/memory.md": DOC_A})).documents[0]
    chunks = chunk_document(doc, 40, 0)
    return _DocPlan(doc=doc, chunks=chunks, stale_ids=["old-1", "old-2"], missing=chunks, kind="updated")


@pytest.mark.unit
def test_work_queued_behind_the_chunk_writes_runs_after_them_in_order(tmp_path, settings):
    plan = _one_plan(tmp_path)
    client = SlowClient()
    writer = _Writer(client, settings, FixedModel(), total=len(plan.missing), progress=False)
    writer.add(plan)
    writer.flush()  # the rows' write (then the stale chunks' delete) in flight
    after = writer.then(lambda: client.events.append("after the chunks") or 7)
    writer.finish()
    assert client.events == [f"upsert {len(plan.missing)}", "delete 2", "after the chunks"]
    assert after.result() == 7 and writer.embedded == len(plan.missing)


@pytest.mark.unit
def test_a_failed_chunk_write_stops_what_follows_it_and_is_raised(tmp_path, settings):
    plan = _one_plan(tmp_path)
    client = SlowClient(error=RuntimeError("Milvus: no space left on device"))
    writer = _Writer(client, settings, FixedModel(), total=len(plan.missing), progress=False)
    writer.add(plan)
    writer.flush()
    after = writer.then(lambda: client.events.append("after the chunks"))
    with pytest.raises(RuntimeError, match="no space left on device"):
        writer.finish()
    assert client.events == []  # neither the stale chunks' delete nor what was queued behind the write
    with pytest.raises(RuntimeError, match="no space left on device"):
        after.result()


class FailingOnDocumentTexts:
    """Embeds the chunks, then fails on the first document-vector text (a title): an ingest interrupted there."""

    def __init__(self, model, titles: set[str]) -> None:
        self.model, self.titles = model, titles

    def get_text_embedding_batch(self, texts):
        if self.titles & set(texts):
            raise KeyboardInterrupt("interrupted")
        return self.model.get_text_embedding_batch(texts)


def test_interrupted_document_vectors_leave_whole_chunks_and_converge(tmp_path, embed_model):
    from kb_retrieval.indexing.doc_vectors import doc_vectors_collection_name, document_texts

    kb = write_kb(tmp_path / "kb", {"redis/memory.md": DOC_A, "mysql/lag.md": DOC_B})
    clean = KBSettings(state_dir=tmp_path / "clean")
    ingest([kb], clean, embed_model=embed_model)
    broken = KBSettings(state_dir=tmp_path / "broken")
    titles = {document_texts(doc)[0] for doc in load_knowledge_base(kb).documents}
    with pytest.raises(KeyboardInterrupt):
        ingest([kb], broken, embed_model=FailingOnDocumentTexts(embed_model, titles))
    # The chunks' write, the flush and the L0 index were in flight on the write thread: all of them done, whole.
    assert set(rows(broken)) == set(rows(clean))
    client = connect(broken)
    assert len(L0Index.load_from_milvus(client, broken).documents) == 2
    assert client.query(doc_vectors_collection_name(broken), filter='source != ""', output_fields=["source"]) == []
    resumed = ingest([kb], broken, embed_model=embed_model)
    assert resumed.chunks_embedded == 0  # only the document vectors were missing
    assert json.loads(broken.l0_index_path().read_text()) == json.loads(clean.l0_index_path().read_text())
