"""The sidecar as a LlamaIndex user sees it (issue 24): its spans sit under the lookup's root span, a factory that
cannot load is a status (never a construction failure), and its comparison rides in the responses and nodes."""

from __future__ import annotations

from typing import Any

import pytest
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.span_handlers.simple import SimpleSpanHandler
from llama_index.core.llms.mock import MockLLM
from llama_index.core.schema import MetadataMode

from kb_retrieval.engine import KnowledgeLookup
from tests.support.kb import ALERT

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def sidecar_lookup(sample_settings) -> Any:
    lookup = KnowledgeLookup(sample_settings.model_copy(update={"sidecar_enabled": True}))
    lookup.lookup(ALERT)  # the stock retriever is created on the first job: its start-up spans are not a lookup's
    yield lookup
    lookup.close()


def test_one_root_span_per_lookup_with_the_sidecar_on(sidecar_lookup):
    handler = SimpleSpanHandler()
    root = get_dispatcher()
    root.add_span_handler(handler)
    try:
        details = sidecar_lookup.lookup_detailed(ALERT)
        sidecar_lookup.lookup("etcd has no leader")
    finally:
        root.span_handlers.remove(handler)
    assert details.sidecar is not None and details.sidecar.trace_entry()["status"] == "ok"
    spans = handler.completed_spans
    roots = sorted(s.id_.split("-")[0] for s in spans if s.parent_id is None)
    assert roots == ["KnowledgeLookup.lookup", "KnowledgeLookup.lookup_detailed"], roots
    names = {s.id_.split("-")[0] for s in spans}
    assert "VectorIndexRetriever.retrieve" in names  # the sidecar's own retrieve, now under the lookup's root


def test_the_comparison_rides_in_responses_and_nodes(sidecar_lookup):
    response = sidecar_lookup.as_query_engine().query(ALERT)
    comparison = response.metadata["sidecar"]
    assert comparison["status"] == "ok" and comparison["top_candidates"]
    assert (
        comparison["same_top_document"] is True
        and "redis/memory-usage-high.md" in comparison["evidence_also_in_sidecar"]
    )
    nodes = sidecar_lookup.as_retriever().retrieve(ALERT)
    assert nodes and all(n.node.metadata["sidecar"]["status"] == "ok" for n in nodes)
    assert "top_candidates" not in nodes[0].node.get_content(metadata_mode=MetadataMode.LLM)
    answered = sidecar_lookup.as_query_engine(llm=MockLLM(max_tokens=4)).query(ALERT)
    assert answered.metadata["redis/memory-usage-high.md"]["sidecar"]["status"] == "ok"  # per source node


def test_a_factory_that_cannot_load_is_status_unavailable(sample_settings):
    settings = sample_settings.model_copy(update={"sidecar_enabled": True, "sidecar_factory": "nope:x"})
    lookup = KnowledgeLookup(settings)  # never a construction failure
    try:
        details = lookup.lookup_detailed(ALERT)
        entry = details.sidecar.trace_entry()
        assert (
            entry["status"] == "unavailable" and "ModuleNotFoundError" in entry["reason"] and "nope" in entry["reason"]
        )
        assert details.result.found  # the main path is untouched
        assert (
            lookup.traces.flush() and lookup.traces.rows()[-1].retrieval_details["sidecar"]["status"] == "unavailable"
        )
    finally:
        lookup.close()
