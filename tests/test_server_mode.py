"""The same ingest and lookup against a real Milvus standalone server (started by the tests)."""

from __future__ import annotations

import pytest

from kb_retrieval.config import Settings
from kb_retrieval.engine import KnowledgeLookup
from kb_retrieval.indexing.ingest import ingest
from tests.conftest import SAMPLE_KB

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def server_settings(milvus_server, tmp_path_factory, embed_model) -> Settings:
    settings = Settings(
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
        assert lookup.retriever.search(embedding, crafted).candidates == []
    assert lookup.retriever.search(embedding, "mysql").candidates
