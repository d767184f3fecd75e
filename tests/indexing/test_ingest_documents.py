"""LlamaIndex Documents and nodes into the collection (Milvus Lite, the real model), a mixed folder through the CLI,
and roots that never overlap (issue 38, items 1 and 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from llama_index.core import Document, SimpleDirectoryReader

from kb_retrieval.cli import main
from kb_retrieval.config import KBSettings
from kb_retrieval.engine import KnowledgeLookup
from kb_retrieval.indexing.ingest import ingest, remove_root
from kb_retrieval.indexing.ingest_record import read_ingest_record
from kb_retrieval.indexing.milvus import connect, iter_rows
from kb_retrieval.knowledge.loader import KnowledgeBaseError
from tests.support.kb import write_kb

pytestmark = pytest.mark.timeout(900)

REDIS = """---
title: Redis evicting keys
category: redis
---
# Redis evicting keys

## Fix
Raise maxmemory or switch the eviction policy to allkeys-lru.
"""
KAFKA = "Kafka consumer group lag keeps growing on topic payments.\nAdd partitions and scale the consumer group out.\n"
NGINX = """<html><head><title>Nginx 502 Bad Gateway</title></head><body><h1>Nginx 502 Bad Gateway</h1>
<p>The php-fpm upstream pool is exhausted and nginx answers 502.</p><h2>Fix</h2><p>Raise pm.max_children in the
php-fpm pool configuration and reload php-fpm.</p></body></html>"""

#: One question per file, and the file that answers it.
QUESTIONS = {
    "Redis is evicting keys, maxmemory reached": "redis.md",
    "Kafka consumer group lag growing on payments": "notes/kafka-lag.txt",
    "nginx returns 502 bad gateway, php-fpm pool exhausted": "web/nginx-502.html",
}


def _kb(root: Path) -> Path:
    return write_kb(root, {"redis.md": REDIS, "notes/kafka-lag.txt": KAFKA, "web/nginx-502.html": NGINX})


def _sources(settings: KBSettings) -> list[str]:
    client = connect(settings)
    return sorted({row["source"] for row in iter_rows(client, settings, ["source"])})


def test_simple_directory_reader_output_is_ingested_and_each_files_content_found(tmp_path, embed_model):
    kb = _kb(tmp_path / "kb")
    settings = KBSettings(state_dir=tmp_path / "state", vector_store_mode="sdk")
    documents = SimpleDirectoryReader(str(kb), recursive=True).load_data()
    first = ingest(documents, settings, embed_model=embed_model)
    assert (first.documents_added, first.skipped_files) == (3, 0)
    lookup = KnowledgeLookup(settings)
    try:
        for question, source in QUESTIONS.items():
            result = lookup.lookup(question)
            assert result.found and result.evidence_blocks[0].source == source, (question, result.evidence_blocks)
        html = lookup.lookup("nginx returns 502 bad gateway, php-fpm pool exhausted").evidence_blocks[0]
        assert html.title == "Nginx 502 Bad Gateway" and "<" not in html.content and "pm.max_children" in html.content
    finally:
        lookup.close()
    # Idempotent: read again (new random doc_ids), nothing embedded; the same folder as a folder is the same root.
    again = ingest(SimpleDirectoryReader(str(kb), recursive=True).load_data(), settings, embed_model=embed_model)
    assert (again.documents_unchanged, again.chunks_embedded) == (3, 0)
    folder = ingest([kb], settings, embed_model=embed_model)
    assert (folder.documents_unchanged, folder.chunks_embedded, folder.documents_removed) == (3, 0, 0)
    assert _sources(settings) == sorted(QUESTIONS.values())
    # Documents are upserted: ingesting one of them alone removes nothing; an edit replaces its chunks.
    edited = Document(text=KAFKA + "Check the consumer's max.poll.interval.ms too.\n",
                      metadata={"file_path": str(kb / "notes" / "kafka-lag.txt")})  # fmt: skip
    one = ingest([edited], settings, embed_model=embed_model, root=kb)
    assert (one.documents_updated, one.documents_removed, one.chunks_replaced) == (1, 0, 1)
    assert _sources(settings) == sorted(QUESTIONS.values())


def test_from_documents_builds_a_lookup_over_documents_with_ids(tmp_path, embed_model):
    settings = KBSettings(state_dir=tmp_path / "state", vector_store_mode="sdk")
    docs = [
        Document(text="Disk /var full on db-01: rotate the logs and grow the volume.", doc_id="wiki/disk-full",
                 metadata={"title": "Disk full", "category": "linux", "keywords": ["DiskFull"]}),
        Document(text="Certificate expires in 3 days: renew it with certbot renew.", doc_id="wiki/cert-expiry",
                 metadata={"title": "Certificate expiry", "category": "tls"}),
    ]  # fmt: skip
    lookup = KnowledgeLookup.from_documents(docs, settings, embed_model=embed_model, name="wiki")
    try:
        result = lookup.lookup("DiskFull alert on db-01")
        assert result.found and result.evidence_blocks[0].source == "wiki/disk-full"
        assert result.evidence_blocks[0].title == "Disk full" and result.evidence_blocks[0].category == "linux"
    finally:
        lookup.close()
    assert read_ingest_record(connect(settings), settings).roots == ()  # a named set has no folder to record
    summary = remove_root("documents:wiki", settings)
    assert summary.documents_removed == 2 and _sources(settings) == []


def test_nested_roots_are_refused_and_a_root_can_be_removed(tmp_path, embed_model):
    kb = _kb(tmp_path / "kb")
    settings = KBSettings(state_dir=tmp_path / "state", vector_store_mode="sdk")
    ingest([kb], settings, embed_model=embed_model)
    for nested in (kb / "web", tmp_path):  # a folder inside the root, and one around it
        with pytest.raises(KnowledgeBaseError, match=r"is inside .*documents would be ingested twice"):
            ingest([nested], settings, embed_model=embed_model)
    with pytest.raises(KnowledgeBaseError, match="is inside"):  # read by SimpleDirectoryReader: the same refusal
        ingest(SimpleDirectoryReader(str(kb / "web")).load_data(), settings, embed_model=embed_model)
    assert _sources(settings) == sorted(QUESTIONS.values())  # nothing written by the refused runs
    with pytest.raises(KnowledgeBaseError, match=r"is not a knowledge-base root .* its roots: "):
        remove_root(kb / "web", settings)
    removed = remove_root(kb, settings)
    assert (removed.documents_removed, _sources(settings)) == (3, [])
    assert read_ingest_record(connect(settings), settings).roots == ()
    # The root out, its subfolder can be a root of its own.
    assert ingest([kb / "web"], settings, embed_model=embed_model).documents_added == 1
    assert _sources(settings) == ["nginx-502.html"]


def test_the_cli_names_every_file_it_skipped_and_removes_a_root(tmp_path, capsys, caplog, embed_model):
    kb = _kb(tmp_path / "kb")
    (kb / "manual.pdf").write_bytes(b"%PDF-1.4 binary")
    (kb / "web" / "logo.png").write_bytes(b"\x89PNG\r\n")
    state = str(tmp_path / "state")
    code = main(["ingest", str(kb), "--state-dir", state, "--json"])
    summary = json.loads(capsys.readouterr().out)
    assert code == 0 and summary["documents_added"] == 3 and summary["skipped_files"] == 2
    assert {(e["source"], e["reason"].split(" (")[0]) for e in summary["skipped"]} == {
        ("manual.pdf", "unsupported file type .pdf"),
        ("web/logo.png", "unsupported file type .png"),
    }
    code = main(["ingest", str(kb), "--state-dir", state])
    out, err = capsys.readouterr()
    assert code == 0 and "skipped files: 2 (each named in a warning above)" in out
    assert "skipped manual.pdf: unsupported file type .pdf" in err + caplog.text
    code = main(["ingest", str(kb / "web"), "--state-dir", state])
    assert code == 2 and "is inside" in capsys.readouterr().err
    code = main(["ingest", "--remove-root", str(kb), "--state-dir", state])
    assert code == 0 and "removed root" in capsys.readouterr().out
    assert _sources(KBSettings(state_dir=state)) == []
