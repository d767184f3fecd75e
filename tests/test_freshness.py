"""A long-lived lookup sees a later ingest (dense, lexical and L0) without a restart (kb_retrieval/freshness.py).
Real Milvus Lite, the real model; the same on a Milvus server is in tests/indexing/test_milvus_server.py."""

from __future__ import annotations

import shutil
from pathlib import Path

from kb_retrieval.engine import KnowledgeLookup
from kb_retrieval.indexing.ingest import ingest
from tests.conftest import SAMPLE_KB
from tests.support.kb import LATER_DOC, ingested, write_kb


def test_a_long_lived_lookup_sees_a_later_ingest(tmp_path: Path, embed_model) -> None:
    kb = tmp_path / "kb"
    shutil.copytree(SAMPLE_KB / "redis", kb / "redis")
    settings = ingested([kb], tmp_path / "state", embed_model, vector_store_mode="sdk", freshness_check_s=0)
    lookup = KnowledgeLookup(settings, embed_model=embed_model)
    query = "ZorkQuuxSpindleJammed on frobnicator-7"
    before = lookup.lookup(query)
    assert "ZorkQuuxSpindleJammed" not in before.query_transform.hints.matched_keywords

    write_kb(kb, LATER_DOC)
    ingest([kb], settings, embed_model=embed_model)  # another writer: the lookup object is not told

    after = lookup.lookup(query)
    assert "ZorkQuuxSpindleJammed" in after.query_transform.hints.matched_keywords  # L0 reloaded
    assert after.found and after.evidence_blocks[0].source == "frobnicator/spindle-jammed.md"
    assert any(r.startswith("lexical_bm25") for r in after.evidence_blocks[0].hit_reasons)  # BM25 reloaded
    assert any(r.startswith("l1_document") for r in after.evidence_blocks[0].hit_reasons)  # document vectors too
    lookup.close()
