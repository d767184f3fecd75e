"""Retriever knobs as VectorIndexRetriever names them: ``similarity_top_k``, ``filters`` (a MetadataFilters scope on
every Milvus request of every attempt), and unknown names refused; on Milvus Lite and on the Milvus server."""

from __future__ import annotations

import pytest
from llama_index.core.vector_stores.types import FilterCondition, FilterOperator, MetadataFilter, MetadataFilters

from kb_retrieval.config import KBSettings
from kb_retrieval.engine import KnowledgeLookup
from kb_retrieval.indexing.ingest import ingest
from kb_retrieval.retrieval.scope import ScopeFilterError
from tests.conftest import SAMPLE_KB

ALERT = "RedisMemoryHigh: Redis memory usage above 90% of maxmemory on redis-cache-01:6379"
MYSQL = MetadataFilters(filters=[MetadataFilter(key="category", value="mysql")])


def test_similarity_top_k_is_the_evidence_documents_returned(sample_lookup):
    assert len(sample_lookup.as_retriever().retrieve(ALERT)) > 2
    nodes = sample_lookup.as_retriever(similarity_top_k=2).retrieve(ALERT)
    assert len(nodes) == 2 and nodes[0].node.node_id == "redis/memory-usage-high.md"
    assert sample_lookup.settings.evidence.max_evidence_blocks == 5  # only that retriever


def test_unknown_overrides_are_refused_with_the_valid_names(sample_lookup):
    with pytest.raises(ValueError, match=r"unknown setting\(s\) top_kk; valid: .*max_evidence_blocks") as raised:
        sample_lookup.as_retriever(top_kk=3)
    assert "\n" not in str(raised.value)
    with pytest.raises(ValueError, match="unknown setting"):
        sample_lookup.with_settings(top_kk=3)


def test_a_filter_to_one_category_returns_only_it_on_every_attempt(sample_lookup):
    nodes = sample_lookup.as_retriever(filters=MYSQL).retrieve(ALERT)  # a Redis alert scoped to mysql
    assert nodes and {n.node.metadata["category"] for n in nodes} == {"mysql"}
    result = sample_lookup.lookup(ALERT, filters=MYSQL)
    assert {b.category for b in result.evidence_blocks} <= {"mysql"}
    attempts = result.retrieval_trace.attempts
    # The L0 hint (redis) is AND-ed with the scope in the filtered attempt; the unfiltered retry keeps the scope.
    assert len(attempts) == 2 and attempts[0].category_filter == "redis"
    assert attempts[0].filter_expr == '(category == "mysql") and category == "redis"'
    assert attempts[1].filter_expr == '(category == "mysql")'
    # Without the scope the same alert finds the redis runbook (the scope is what changed it).
    assert sample_lookup.lookup(ALERT).evidence_blocks[0].source == "redis/memory-usage-high.md"


def test_a_scope_that_holds_no_document_is_an_empty_answer_not_an_outage(sample_lookup):
    """The unfiltered search of a known collection that answers nothing is an outage (issue 23), unless a caller's
    scope narrowed it: a team with no documents gets no evidence, and the knowledge base is not called down."""
    nobody = MetadataFilters(filters=[MetadataFilter(key="category", value="no-such-team")])
    result = sample_lookup.lookup(ALERT, filters=nobody)
    assert not result.found
    assert result.evidence_status == "no_evidence"
    assert [a.outcome for a in result.retrieval_trace.attempts] == ["no_candidates", "no_candidates"]


def test_exact_identifier_and_bm25_hits_stay_inside_the_scope(sample_lookup):
    # 'RedisMemoryHigh' is a rare identifier (an exact-identifier candidate) and a strong BM25 term of redis pages.
    scope = MetadataFilters(filters=[MetadataFilter(key="category", value=["linux", "mysql"], operator="in")])
    details = sample_lookup.lookup_detailed("RedisMemoryHigh", filters=scope)
    assert details.ranking and {c.category for c in details.ranking} <= {"linux", "mysql"}


def test_or_and_metadata_keys(sample_lookup):
    either = MetadataFilters(
        filters=[MetadataFilter(key="category", value="mysql"), MetadataFilter(key="severity", value="critical")],
        condition=FilterCondition.OR,
    )
    sources = {c.source for c in sample_lookup.lookup_detailed("node not ready kubelet", filters=either).ranking}
    assert "kubernetes/node-not-ready.md" in sources  # the one page with severity: critical
    assert {s.split("/")[0] for s in sources} <= {"mysql", "kubernetes"}
    assert {s for s in sources if s.startswith("kubernetes/")} == {"kubernetes/node-not-ready.md"}
    not_mysql = MetadataFilters(filters=[MetadataFilter(key="category", value=["mysql"], operator=FilterOperator.NIN)])
    assert "mysql" not in {
        c.category for c in sample_lookup.lookup_detailed("mysql replication lag", filters=not_mysql).ranking
    }
    critical = MetadataFilters(
        filters=[MetadataFilter(key="severity", value=["critical"], operator=FilterOperator.IN)]
    )  # `in` on a JSON metadata key (Milvus Lite refuses the plain form)
    assert {c.source for c in sample_lookup.lookup_detailed("node not ready", filters=critical).ranking} == {
        "kubernetes/node-not-ready.md"
    }
    later = MetadataFilters(filters=[MetadataFilter(key="position", value=1, operator=FilterOperator.GTE)])
    assert sample_lookup.lookup_detailed(ALERT, filters=later).ranking  # a numeric comparison on a JSON key runs


def test_a_bad_operator_or_unknown_key_is_an_error_at_construction(sample_lookup):
    bad = MetadataFilters(filters=[MetadataFilter(key="category", value="redis", operator=FilterOperator.TEXT_MATCH)])
    with pytest.raises(ScopeFilterError, match="operator 'text_match' is not supported"):
        sample_lookup.as_retriever(filters=bad)
    with pytest.raises(ScopeFilterError, match="filter key 'tenant' is not a field of the collection"):
        sample_lookup.lookup(ALERT, filters=MetadataFilters(filters=[MetadataFilter(key="tenant", value="acme")]))


@pytest.mark.server
def test_a_filter_to_one_category_on_the_milvus_server(milvus_server, tmp_path, embed_model):
    settings = KBSettings(
        state_dir=tmp_path, milvus_uri=milvus_server.uri, collection="kb_scope_test", vector_store_mode="sdk"
    )
    ingest([SAMPLE_KB / "redis", SAMPLE_KB / "mysql"], settings, embed_model=embed_model)
    for mode in ("sdk", "vectorstore"):
        lookup = KnowledgeLookup(settings.model_copy(update={"vector_store_mode": mode}), embed_model=embed_model)
        try:
            assert lookup.lexical_mode == "in_process_bm25"  # Milvus 2.3: BM25 and exact hits in process
            nodes = lookup.as_retriever(filters=MYSQL).retrieve(ALERT)
            assert nodes and {n.node.metadata["category"] for n in nodes} == {"mysql"}, mode
            details = lookup.lookup_detailed("RedisMemoryHigh maxmemory", filters=MYSQL)
            assert details.ranking and {c.category for c in details.ranking} == {"mysql"}, mode
            assert lookup.lookup(ALERT).evidence_blocks[0].source == "memory-usage-high.md"
        finally:
            lookup.close()
