"""The L0 index stored in Milvus beside the collection, and the index version, on Milvus Lite with the real model.

The same behaviour on a Milvus server (two hosts, two ingests at once, a version seen from another process) is in
``tests/indexing/test_milvus_server.py``.
"""

from __future__ import annotations

import json

import pytest

from kb_retrieval.config import KBSettings
from kb_retrieval.indexing import index_version as index_version_module
from kb_retrieval.indexing.index_version import index_version, meta_collection_name, version_content
from kb_retrieval.indexing.ingest import ingest
from kb_retrieval.indexing.ingest_record import FIELD_PREFIX, MODEL_KEY, ROOT_PREFIX
from kb_retrieval.indexing.l0_index import (
    L0_ENTRY_MAX_BYTES,
    L0Index,
    entry_for,
    l0_collection_name,
    l0_content_hash,
    write_l0,
)
from kb_retrieval.indexing.milvus import connect, ensure_collection, iter_rows
from kb_retrieval.knowledge.loader import load_knowledge_base
from tests.indexing.test_ingest import DOC_A, DOC_B, write_kb

DOC_C = "---\ntitle: Disk full\nkeywords: [NodeFilesystemFull]\ncategory: linux\n---\n# Disk full\n\n## Steps\nrm.\n"


@pytest.fixture
def settings(tmp_path) -> KBSettings:
    return KBSettings(state_dir=tmp_path / "a")


def l0_rows(settings: KBSettings) -> dict[str, dict]:
    client = connect(settings)
    name = l0_collection_name(settings)
    client.load_collection(name)
    return {r["source"]: r for r in iter_rows(client, settings, ["source", "kb", "doc_hash", "entry"], collection=name)}


def test_one_row_per_document_in_the_companion_collection(tmp_path, settings, embed_model):
    kb = write_kb(tmp_path / "kb", {"redis/memory.md": DOC_A, "mysql/lag.md": DOC_B})
    ingest([kb], settings, embed_model=embed_model)
    rows = l0_rows(settings)
    assert set(rows) == {"redis/memory.md", "mysql/lag.md"}
    redis = rows["redis/memory.md"]
    assert redis["kb"] == kb.resolve().as_posix() and len(redis["doc_hash"]) == 64
    assert redis["entry"]["title"] == "Redis memory usage high"
    assert redis["entry"]["keywords"] == ["RedisMemoryHigh", "maxmemory"]
    assert redis["entry"]["category"] == "redis" and redis["entry"]["entities"] == ["redis-cli"]
    assert rows["mysql/lag.md"]["entry"]["headings"] == ["MySQL replication lag", "Diagnosis"]
    # The local file is a copy of what Milvus holds, nothing more.
    loaded = L0Index.load_from_milvus(connect(settings), settings)
    assert loaded.enabled and loaded.off_reason is None
    assert loaded.documents == L0Index.load(settings.l0_index_path()).documents
    assert loaded.content_hash == L0Index.load(settings.l0_index_path()).content_hash != ""


def test_another_state_dir_reads_the_same_l0_index(tmp_path, settings, embed_model):
    kb = write_kb(tmp_path / "kb", {"redis/memory.md": DOC_A, "mysql/lag.md": DOC_B})
    ingest([kb], settings, embed_model=embed_model)
    other = KBSettings(
        state_dir=tmp_path / "b", milvus_uri=settings.resolved_milvus_uri()
    )  # a host that never ingested
    from_b = L0Index.load_from_milvus(connect(other), other)
    assert not other.l0_index_path().exists()
    assert from_b.documents == L0Index.load(settings.l0_index_path()).documents
    assert from_b.documents["redis/memory.md"].category == "redis"
    assert from_b.index_version == index_version(connect(settings), settings) != ""


def test_collection_without_companion_gives_l0_off(tmp_path, settings):
    client = connect(settings)
    ensure_collection(client, settings)  # as another tool would leave it: chunks only
    loaded = L0Index.load_from_milvus(client, settings)
    assert not loaded.enabled and loaded.documents == {}
    assert loaded.off_reason is not None and f"'{l0_collection_name(settings)}'" in loaded.off_reason
    assert "kb-retrieval ingest" in loaded.off_reason
    assert loaded.index_version == "" == index_version(client, settings)


def test_edits_and_removals_touch_only_their_rows(tmp_path, settings, embed_model):
    a = write_kb(tmp_path / "a", {"redis/memory.md": DOC_A, "mysql/lag.md": DOC_B})
    b = write_kb(tmp_path / "b", {"linux/disk.md": DOC_C})
    ingest([a], settings, embed_model=embed_model)
    ingest([b], settings, embed_model=embed_model)
    before = l0_rows(settings)
    (a / "redis/memory.md").write_text(DOC_A.replace("maxmemory]", "maxmemory, evicted_keys]"), encoding="utf-8")
    (a / "mysql/lag.md").unlink()
    ingest([a], settings, embed_model=embed_model)
    after = l0_rows(settings)
    assert set(after) == {"redis/memory.md", "linux/disk.md"}  # b's entry kept, a's removed document gone
    assert after["redis/memory.md"]["entry"]["keywords"] == ["RedisMemoryHigh", "maxmemory", "evicted_keys"]
    assert after["redis/memory.md"]["doc_hash"] != before["redis/memory.md"]["doc_hash"]
    assert after["linux/disk.md"] == before["linux/disk.md"]
    # Nothing left to write for folders already in line.
    kbs = [load_knowledge_base(a), load_knowledge_base(b)]
    assert write_l0(connect(settings), settings, kbs, _chunk_ids(settings)) == 0


def _chunk_ids(settings: KBSettings) -> dict[str, list[str]]:
    client = connect(settings)
    ids: dict[str, list[str]] = {}
    for row in iter_rows(client, settings, [settings.schema_fields.id_field, settings.schema_fields.source_field]):
        ids.setdefault(row[settings.schema_fields.source_field], []).append(row[settings.schema_fields.id_field])
    return ids


STEP = "check the next thing in the long procedure " * 20
LONG_HEADINGS = "".join(f"## Step {i}: {STEP}\n\nDo it.\n\n" for i in range(80))


def test_an_oversized_entry_is_cut_to_fit(tmp_path, settings, embed_model):
    kb = write_kb(tmp_path / "kb", {"ops/long.md": f"# Long runbook\n\n{LONG_HEADINGS}"})
    doc = load_knowledge_base(kb).documents[0]
    assert len(json.dumps(doc.headings).encode()) > 65536  # over Milvus' JSON limit as it is
    entry = entry_for(doc, "kb")
    assert len(entry.model_dump_json().encode()) <= L0_ENTRY_MAX_BYTES
    # Headings go first, then entities, then keywords (the H2 headings are keywords too), each cut from the end.
    assert len(entry.headings) < len(doc.headings) and 0 < len(entry.keywords) < len(doc.keywords)
    assert entry.headings == doc.headings[: len(entry.headings)]
    assert entry.keywords == doc.keywords[: len(entry.keywords)] and entry.title == doc.title
    ingest([kb], settings, embed_model=embed_model)
    assert l0_rows(settings)["ops/long.md"]["entry"]["headings"] == entry.headings


# --- the index version ---------------------------------------------------------------------------------------------


def test_version_changes_with_each_ingest_that_writes_and_only_then(tmp_path, settings, embed_model):
    kb = write_kb(tmp_path / "kb", {"redis/memory.md": DOC_A})
    reader = connect(KBSettings(state_dir=tmp_path / "reader", milvus_uri=settings.resolved_milvus_uri()))
    assert index_version(reader, settings) == ""  # nothing ingested yet
    ingest([kb], settings, embed_model=embed_model)
    first = index_version(reader, settings)
    assert first and version_content(first) == l0_content_hash(reader, settings)
    ingest([kb], settings, embed_model=embed_model)
    assert index_version(reader, settings) == first  # nothing changed: same version
    write_kb(kb, {"mysql/lag.md": DOC_B})
    ingest([kb], settings, embed_model=embed_model)
    added = index_version(reader, settings)
    assert added != first
    (kb / "mysql/lag.md").unlink()
    ingest([kb], settings, embed_model=embed_model)
    removed = index_version(reader, settings)
    assert removed not in (added, first)  # back to the first content, still a new version
    assert version_content(removed) == version_content(first)


def test_a_run_killed_before_publishing_is_published_by_the_next(tmp_path, settings, embed_model, monkeypatch):
    kb = write_kb(tmp_path / "kb", {"redis/memory.md": DOC_A})
    ingest([kb], settings, embed_model=embed_model)
    first = index_version(connect(settings), settings)
    write_kb(kb, {"mysql/lag.md": DOC_B})
    real_publish = index_version_module.publish_version

    def killed(*args, **kwargs):
        raise KeyboardInterrupt("killed before publishing")

    monkeypatch.setattr("kb_retrieval.indexing.ingest.publish_version", killed)
    with pytest.raises(KeyboardInterrupt):
        ingest([kb], settings, embed_model=embed_model)
    assert index_version(connect(settings), settings) == first  # written, not announced
    monkeypatch.setattr("kb_retrieval.indexing.ingest.publish_version", real_publish)
    again = ingest([kb], settings, embed_model=embed_model)
    assert (again.chunks_embedded, again.chunks_added) == (0, 0)  # nothing left to write, yet:
    assert index_version(connect(settings), settings) not in ("", first)


def test_version_lives_in_its_own_small_collection(tmp_path, settings, embed_model):
    kb = write_kb(tmp_path / "kb", {"redis/memory.md": DOC_A})
    ingest([kb], settings, embed_model=embed_model)
    client = connect(settings)
    name = meta_collection_name(settings)
    assert name == f"{settings.storage.collection}_meta" and client.has_collection(name)
    rows = {r["key"]: r["value"] for r in client.query(name, filter='key != ""', output_fields=["key", "value"])}
    assert rows["version"] == index_version(client, settings)
    # Beside it, only the ingest record (kb_retrieval.indexing.ingest_record): the model, the roots, metadata keys.
    record = ("version", MODEL_KEY)
    assert all(k in record or k.startswith((ROOT_PREFIX, FIELD_PREFIX)) for k in rows), rows
