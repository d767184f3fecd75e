"""Every override honoured or refused (issue 38, item 5): the policy alone, pure logic."""

from __future__ import annotations

import pytest

from kb_retrieval.config import KBSettings
from kb_retrieval.overrides import FIXED, INSTEAD, UnsupportedOverrideError, check_overrides

pytestmark = pytest.mark.unit

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


@pytest.mark.parametrize("name", sorted(OTHER))
def test_a_setting_fixed_at_build_time_is_refused_naming_it_and_why(name: str) -> None:
    with pytest.raises(UnsupportedOverrideError) as raised:
        check_overrides({name: OTHER[name]}, KBSettings())
    assert str(raised.value) == f"{name} cannot be overridden: {FIXED[name]}"


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


def test_what_a_lookup_reads_is_accepted_and_so_is_a_fixed_setting_at_its_own_value() -> None:
    settings = KBSettings()
    check_overrides({"top_k": 50, "lexical_weight": 0.2, "memory_plan_max_mb": 1.0}, settings)
    check_overrides({"collection": settings.storage.collection, "dim": settings.schema_fields.dim}, settings)
    with pytest.raises(UnsupportedOverrideError, match=r"^unknown setting\(s\) top_kk; valid: "):
        check_overrides({"top_kk": 3}, settings)


def test_every_fixed_name_is_a_setting() -> None:
    names = set(KBSettings.setting_names())
    assert set(FIXED) <= names and not set(INSTEAD) & names


def test_a_request_refusal_says_why():
    import kb_retrieval.overrides as overrides

    assert overrides.request_refusal("collection").startswith("cannot be changed per request: the pipeline holds")
    assert overrides.request_refusal("doc_ids").startswith("not supported: a document is its source id")
    assert overrides.request_refusal("nope") == "no such setting"
