"""Every override honoured or refused (issue 38, item 5): the policy alone, pure logic; then on the sample KB,
through ``as_retriever`` and ``as_query_engine``, where a LlamaIndex engineer meets it."""

from __future__ import annotations

from typing import Any

import pytest

from kb_retrieval.config import KBSettings
from kb_retrieval.overrides import FIXED, INSTEAD, UnsupportedOverrideError, check_overrides
from tests.support.kb import ALERT

#: A value other than the default for each setting fixed at build time.
OTHER = {
    "state_dir": "/elsewhere",
    "milvus_uri": "http://127.0.0.1:19530",
    "milvus_token": "user:password",
    "milvus_timeout_s": 1.0,
    "collection": "nope",
    "dim": 10,
    "metric": "L2",
    "embed_model": "/nonexistent",
    "query_encoder": "embed_model",
    "vector_store_mode": "vectorstore",
    "lookup_plan": "milvus",
    "chunk_tokens": 50,
    "trace_db_url": "sqlite://",
    "sidecar_enabled": True,
}


@pytest.mark.unit
@pytest.mark.parametrize("name", sorted(OTHER))
def test_a_setting_fixed_at_build_time_is_refused_naming_it_and_why(name: str) -> None:
    with pytest.raises(UnsupportedOverrideError) as raised:
        check_overrides({name: OTHER[name]}, KBSettings())
    assert str(raised.value) == f"{name} cannot be overridden: {FIXED[name]}"


@pytest.mark.unit
@pytest.mark.parametrize(
    ("name", "instead"),
    [
        ("vector_store_query_mode", "lexical_enabled=False"),
        ("alpha", "lexical_weight"),
        ("node_ids", "filters=MetadataFilters"),
        ("doc_ids", "filters=MetadataFilters"),
    ],
)
def test_a_vector_index_knob_with_no_counterpart_says_what_to_use_instead(name: str, instead: str) -> None:
    with pytest.raises(UnsupportedOverrideError, match=f"^{name} is not supported: ") as raised:
        check_overrides({name: "x"}, KBSettings())
    assert instead in str(raised.value) and INSTEAD[name] in str(raised.value)


@pytest.mark.unit
def test_what_a_lookup_reads_is_accepted_and_so_is_a_fixed_setting_at_its_own_value() -> None:
    settings = KBSettings()
    check_overrides({"top_k": 50, "lexical_weight": 0.2, "memory_plan_max_mb": 1.0}, settings)
    check_overrides({"collection": settings.storage.collection, "dim": settings.schema_fields.dim}, settings)
    with pytest.raises(UnsupportedOverrideError, match=r"^unknown setting\(s\) top_kk; valid: "):
        check_overrides({"top_kk": 3}, settings)


@pytest.mark.unit
def test_every_fixed_name_is_a_setting() -> None:
    names = set(KBSettings.setting_names())
    assert set(FIXED) <= names and not set(INSTEAD) & names


@pytest.mark.unit
def test_a_request_refusal_says_why():
    import kb_retrieval.overrides as overrides

    assert overrides.request_refusal("collection").startswith("cannot be changed per request: the pipeline holds")
    assert overrides.request_refusal("doc_ids").startswith("not supported: a document is its source id")
    assert overrides.request_refusal("nope") == "no such setting"


@pytest.mark.parametrize(
    ("override", "says"),
    [
        ({"collection": "nope"}, "collection cannot be overridden: the pipeline holds one Milvus client"),
        ({"dim": 10}, "dim cannot be overridden: read from the collection's schema"),
        ({"milvus_uri": "http://127.0.0.1:9"}, "milvus_uri cannot be overridden"),
        ({"state_dir": "/elsewhere"}, "state_dir cannot be overridden"),
        ({"embed_model": "/nonexistent"}, "embed_model cannot be overridden: the query model is loaded once"),
        ({"vector_store_query_mode": "hybrid"}, "lexical_enabled=False for dense only"),
        ({"alpha": 0.5}, "the dense/BM25 balance is lexical_weight"),
        ({"node_ids": ["x"]}, "key='id' for chunk ids"),
        ({"doc_ids": ["redis/memory-usage-high.md"]}, "a document is its source id"),
    ],
)
def test_an_override_that_cannot_be_honoured_is_refused(sample_lookup, override: dict[str, Any], says: str) -> None:
    with pytest.raises(UnsupportedOverrideError, match=says.replace("(", r"\(").replace(")", r"\)")):
        sample_lookup.as_retriever(**override)
    with pytest.raises(UnsupportedOverrideError, match=says.replace("(", r"\(").replace(")", r"\)")):
        sample_lookup.as_query_engine(**override)


def test_an_override_the_pipeline_reads_is_honoured(sample_lookup) -> None:
    assert len(sample_lookup.as_retriever(max_evidence_blocks=1).retrieve(ALERT)) == 1
    same = sample_lookup.as_retriever(collection=sample_lookup.settings.storage.collection)  # its own value: accepted
    assert same.retrieve(ALERT)[0].node.node_id == "redis/memory-usage-high.md"
