"""Failing vector-store paths: ``auto`` serves from ``sdk`` and says why; both down is ``found = false`` with both
errors in the trace, and nothing escapes the ``lookup_knowledge`` tool. (Server outages: test_milvus_outage.py.)"""

from __future__ import annotations

from kb_retrieval.engine import KnowledgeLookup
from kb_retrieval.retrieval.l1 import AutoPath, SdkPath
from kb_retrieval.retrieval.l1.base import L1Search
from kb_retrieval.tool import make_lookup_tool
from kb_retrieval.traces import TraceStore
from tests.reliability.conftest import KNOWN_QUERIES, check_result

QUERY, SOURCE = next(iter(KNOWN_QUERIES.items()))


class Raising:
    def __init__(self, name: str, exc: Exception) -> None:
        self.name = name
        self.exc = exc
        self.calls = 0

    def search(self, embedding, top_k, filter_expr, timeout=None) -> L1Search:
        self.calls += 1
        raise self.exc


def _lookup(known_kb, embed_model, tmp_path, path) -> KnowledgeLookup:
    store = TraceStore(f"sqlite:///{tmp_path / 'traces.db'}")
    return KnowledgeLookup(known_kb, embed_model=embed_model, path=path, trace_store=store)


def test_auto_serves_from_sdk_when_the_vectorstore_raises(known_kb, embed_model, tmp_path):
    probe = KnowledgeLookup(known_kb, embed_model=embed_model, trace_store=TraceStore("sqlite://"))
    broken = Raising("vectorstore", TimeoutError("deadline exceeded"))
    lookup = _lookup(known_kb, embed_model, tmp_path, AutoPath(broken, SdkPath(probe.client, known_kb)))
    result = lookup.lookup(QUERY)
    check_result(result, known_kb)
    assert result.found and result.evidence_blocks[0].source == SOURCE
    assert result.retrieval_trace.path_served == "sdk"
    for attempt in result.retrieval_trace.attempts:
        assert attempt.path == "sdk"
        assert attempt.path_fallback_reason == "vectorstore failed: TimeoutError: deadline exceeded"
    row = lookup.traces.rows()[-1].retrieval_details
    assert row["retrieval_trace"]["attempts"][0]["path_fallback_reason"].startswith("vectorstore failed:")


def test_both_paths_down_is_found_false_with_both_errors_in_the_trace(known_kb, embed_model, tmp_path):
    store_error = ConnectionError("vectorstore: server unavailable")
    sdk_error = ConnectionError("sdk: Fail connecting to server on 127.0.0.1:19530")
    path = AutoPath(Raising("vectorstore", store_error), Raising("sdk", sdk_error))
    lookup = _lookup(known_kb, embed_model, tmp_path, path)

    result = lookup.lookup(QUERY)

    check_result(result, known_kb)
    assert result.found is False and result.evidence_blocks == []
    attempts = result.retrieval_trace.attempts
    assert attempts and all(a.outcome == "error" for a in attempts)
    for attempt in attempts:
        assert "vectorstore failed: ConnectionError: vectorstore: server unavailable" in attempt.error
        assert "sdk failed: ConnectionError: sdk: Fail connecting" in attempt.error
    assert "attempt 1: error" in result.message and result.evidence_status.value == "knowledge_base_unavailable"
    assert result.trace_recorded
    details = lookup.traces.rows()[-1].retrieval_details
    assert "sdk failed" in details["retrieval_trace"]["attempts"][0]["error"]
    assert details["evidence_blocks"] == [] and lookup.traces.rows()[-1].found is False


def test_tool_returns_text_whatever_fails_below_it(known_kb, embed_model, tmp_path):
    down = AutoPath(Raising("vectorstore", OSError("down")), Raising("sdk", OSError("down too")))
    tool = make_lookup_tool(_lookup(known_kb, embed_model, tmp_path, down))
    output = tool.call(query=QUERY)
    assert not output.is_error
    assert output.content.startswith("The knowledge base could not be searched")

    class BrokenModel:  # a failure outside retrieval (the embedding model) is still text for the agent
        def get_query_embedding(self, text):
            raise RuntimeError("CUDA out of memory")

        get_agg_embedding_from_queries = get_query_embedding

    lookup = _lookup(known_kb, embed_model, tmp_path, down)
    lookup.query_embed_model = BrokenModel()  # type: ignore[assignment]
    lookup.dense.embed_model = lookup.query_embed_model
    output = make_lookup_tool(lookup).call(query=QUERY)
    assert output.content == "lookup_knowledge error: the lookup failed (RuntimeError); no evidence returned."
    assert "CUDA" not in output.content  # no internals to the agent


def test_lite_clients_never_ping_an_idle_server(sample_settings, embed_model):
    """Milvus Lite's in-process gRPC server allows one ping per 5 minutes; pymilvus' default is every 10 s, calls or
    not, which got idle clients sent away after ~30 s (seen as 'Fail connecting' when the suite's shared Lite lookup
    sat idle during other tests). Both paths' clients must carry the Lite keepalive policy."""
    lookup = KnowledgeLookup(
        sample_settings.model_copy(update={"vector_store_mode": "auto"}),
        embed_model=embed_model,
        trace_store=TraceStore("sqlite://"),
    )
    assert lookup.lookup(QUERY).found
    store_client = lookup.path.preferred.store.client  # type: ignore[attr-defined]
    for client in (lookup.client, store_client):
        options = client._handler._grpc_options  # pymilvus keeps the channel options it reconnects with here
        assert options["grpc.keepalive_time_ms"] >= 300_000
        assert options["grpc.keepalive_permit_without_calls"] is False
