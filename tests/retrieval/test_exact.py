"""Exact-identifier evidence: the matcher pinned with small fakes, then a unique identifier finds its document
first with found=true on the sample KB and on the public runbooks corpus (real Milvus Lite, the real model)."""

from __future__ import annotations

import numpy as np
import pytest

from kb_retrieval.retrieval.evidence import build_evidence_blocks, is_ranking_fill
from kb_retrieval.retrieval.exact import ExactIdentifierIndex, is_identifier, is_name, query_identifiers
from kb_retrieval.retrieval.rerank import RuleReranker
from kb_retrieval.retrieval.stage import candidate_node
from tests.support.candidates import cand


@pytest.mark.parametrize(
    "token",
    ["kube_pod_status_ready", "observedGeneration", "podmonitors.monitoring.coreos.com", "ENOTFOUND", "--total-shards"],
)
def test_identifiers_are_recognised(token):
    assert is_identifier(token)


@pytest.mark.parametrize(
    "token", ["pods", "memory", "pg-replica-2", "wk-19", "2024", "60-90s", "RAID", "api-7f9", "PersistentVolume"]
)
def test_words_numbers_and_instance_names_are_not_identifiers(token):
    assert not is_identifier(token)


@pytest.mark.unit
@pytest.mark.parametrize(
    "token", ["kube_pod_status_ready", "--web.enable-lifecycle", "ENOTFOUND", "/api/v1/query", "k8s.io", "job:rate5m"]
)
def test_metric_flag_path_and_error_names_are_names(token):
    assert is_name(token)


@pytest.mark.unit
@pytest.mark.parametrize(
    "token",
    ["42", "0.95", "80%", "30s", "1h30m", "v2.45.0", "1.2.3-rc.1", "10.0.0.1:9090", "10.0.0.0/8", "fe80::1",
     "5f7d9c8b", "0xdeadbeef", "sha256:e3b0c442", "123e4567-e89b-12d3-a456-426614174000",
     "https://api.example.com", "registry.example.com/web/frontend:1.43.0", "node-3:9100", "/dev/nvme0n1p1"],
)  # fmt: skip
def test_numbers_durations_versions_addresses_hashes_and_instances_are_values(token):
    assert not is_name(token)


@pytest.mark.unit
def test_unheld_are_the_query_names_no_document_holds_in_query_order():
    index = ExactIdentifierIndex.build(
        [("a1", "a.md", "alert on kube_pod_info_total and ENOTFOUND"), ("b1", "b.md", "flag --web.enable-lifecycle")]
    )
    query = "node_load15 high, kube_pod_info and --web.enable-lifecycle ok, ECONNRESET from 10.0.0.1, sha256:e3b0c442"
    # held inside a longer token counts as held; values (an address, a hash) are never asked of the index
    assert index.unheld(query) == ["node_load15", "ECONNRESET"]
    assert index.unheld("kube_pod_info_total and enotfound") == []
    assert index.unheld("why is the pod slow") == []


@pytest.mark.unit
def test_identifiers_answer_match_and_unheld_with_one_lookup_each():
    """One holders lookup per identifier gives what the two questions asked separately give: the hits held by
    1..max_df documents, and the names held by none (a token past the limit is held, not unheld)."""
    index = ExactIdentifierIndex.build(
        [
            ("a1", "a.md", "alert on kube_pod_info_total and ENOTFOUND"),
            ("b1", "b.md", "flag --web.enable-lifecycle and kube_pod_info"),
            ("c1", "c.md", "kube_pod_info again"),
        ]
    )
    queries = [
        "node_load15 high, kube_pod_info and --web.enable-lifecycle ok, ECONNRESET from 10.0.0.1",
        "ENOTFOUND kube_pod_info_total node_load15 sha256:e3b0c442",
        "why is the pod slow",
    ]
    for query in queries:
        for max_df in (0, 1, 2, 3):
            scan = index.identifiers(query, max_df)
            asked = query_identifiers(query)
            unheld = [t for t in asked if is_name(t) and index.holders(t, limit=0) == {}]
            hits = [t for t in asked if index.holders(t, limit=max_df)]
            assert scan.unheld == unheld == index.unheld(query), (query, max_df)
            assert sorted(h.token for h in scan.hits) == sorted(hits), (query, max_df)
    assert index.identifiers(queries[0], 1).unheld == ["node_load15", "ECONNRESET"]
    assert [h.token for h in index.identifiers(queries[0], 1).hits] == ["--web.enable-lifecycle"]


def test_query_identifiers_keep_order_and_drop_sentence_punctuation():
    query = "sts/kafka: observedGeneration 12 vs metadata.generation 14. getaddrinfo ENOTFOUND redis-0."
    assert query_identifiers(query) == ["observedGeneration", "metadata.generation", "ENOTFOUND"]
    assert query_identifiers("disk {{ $labels.device }} at $value on {{$labels.node_name}}") == []


def test_match_counts_documents_not_chunks_and_respects_max_df():
    index = ExactIdentifierIndex.build(
        [
            ("a1", "a.md", "error getaddrinfo ENOTFOUND in the client"),
            ("a2", "a.md", "ENOTFOUND again"),
            ("b1", "b.md", "uses observedGeneration"),
            ("c1", "c.md", "observedGeneration too"),
            ("d1", "d.md", "observedGeneration as well"),
        ]
    )
    hits = index.match("client logs ENOTFOUND while observedGeneration lags")
    assert [(h.token, h.sources, h.chunk_ids) for h in hits] == [("ENOTFOUND", ("a.md",), ("a1", "a2"))]
    assert index.document_frequency("observedgeneration") == 3
    assert index.document_frequency("observedGen") == 3  # inside a longer token too
    assert [h.token for h in index.match("ENOTFOUND observedGeneration", max_df=3)] == [
        "ENOTFOUND",
        "observedGeneration",
    ]
    assert index.match("UNKNOWN_METRIC_NAME") == []


def test_exact_identifier_makes_evidence_despite_low_similarity():
    nodes = [
        candidate_node(cand("a", "a.md", 0.30), exact_terms=["ENOTFOUND"]),
        candidate_node(cand("b", "b.md", 0.30)),
    ]
    ranked = RuleReranker().postprocess_nodes(nodes, query_str="getaddrinfo ENOTFOUND")
    blocks = build_evidence_blocks(ranked, evidence_threshold=0.42, max_blocks=5)
    # b, as weak and without it, is no evidence: it only follows the ranking once a answers
    assert [b.source for b in blocks] == ["a.md", "b.md"] and [is_ranking_fill(b) for b in blocks] == [False, True]
    assert "exact_match:ENOTFOUND" in blocks[0].hit_reasons
    strict = build_evidence_blocks(ranked, evidence_threshold=0.42, max_blocks=5, fill_by_ranking=False)
    assert [b.source for b in strict] == ["a.md"]


def test_a_unique_error_string_finds_its_document_on_the_sample_kb(sample_lookup):
    result = sample_lookup.lookup("the checkout service logs getaddrinfo ENOTFOUND since the deploy")
    assert result.found
    top = result.evidence_blocks[0]
    assert top.source == "network/dns-resolution-troubleshooting.md"
    assert "exact_match:ENOTFOUND" in top.hit_reasons


def test_on_the_sample_kb_a_name_it_does_not_hold_keeps_relevance_below_high(sample_lookup):
    held = sample_lookup.lookup("pods keep restarting with CrashLoopBackOff")
    assert held.relevance_level == "high"
    assert "unheldIdentifiers" not in held.retrieval_trace.calibration
    # the same question naming a metric no runbook of the sample KB holds: the KB lacks that specific thing
    unheld = sample_lookup.lookup("pods keep restarting with CrashLoopBackOff, kube_pod_restart_budget_left is 0")
    assert unheld.found and unheld.evidence_blocks[0].source == held.evidence_blocks[0].source
    assert unheld.relevance_level == "medium"
    assert unheld.retrieval_trace.calibration["unheldIdentifiers"] == ["kube_pod_restart_budget_left"]


def test_a_unique_metric_name_finds_its_runbook_in_the_runbooks_corpus(runbooks_lookup):
    # No alert name: only the metric, which one runbook in the corpus names verbatim.
    result = runbooks_lookup.lookup("graph of kube_node_status_capacity_pods is flat at the running count on worker-3")
    assert result.found
    top = result.evidence_blocks[0]
    assert top.source == "content/runbooks/kubernetes/KubeletTooManyPods.md"
    assert "exact_match:kube_node_status_capacity_pods" in top.hit_reasons


@pytest.mark.unit
def test_holders_are_every_chunk_with_a_token_containing_the_needle():
    """Pinned against a direct scan of every chunk's tokens: the arrays give the same documents and chunks."""
    import random

    from kb_retrieval.retrieval.exact import tokens

    rng = random.Random(11)
    words = ["kube_pod_info", "kube_pod_info_total", "observedGeneration", "--max-old", "/var/lib", "ENOTFOUND", "x"]
    rows = [(f"c{i}", f"doc{i % 17}.md", " ".join(rng.choices(words, k=rng.randint(0, 5))) + ".") for i in range(120)]
    index = ExactIdentifierIndex.build(rows)
    for needle in ["kube_pod_info", "KUBE_POD", "observedgen", "--max", "/var", "enotfound", "absent", "info_total"]:
        expected: dict[str, set[str]] = {}
        for chunk_id, source, text in rows:
            if any(needle.lower() in t.lower() for t in tokens(text)):
                expected.setdefault(source, set()).add(chunk_id)
        assert dict(index.holders(needle)) == expected
        assert index.document_frequency(needle) == len(expected)
    assert ExactIdentifierIndex.build([]).holders("kube_pod_info") == {}


@pytest.mark.unit
def test_a_limit_stops_at_the_first_document_past_it():
    index = ExactIdentifierIndex.build([(f"c{i}", f"d{i % 3}.md", "kube_pod_info_total pods") for i in range(30)])
    assert index.holders("kube_pod_info", limit=2) is None  # three documents hold it
    assert set(index.holders("kube_pod_info", limit=3) or {}) == {"d0.md", "d1.md", "d2.md"}
    assert index.token_holders("pods", limit=1) is None
    assert index.stem_frequency("pod", limit=1) == 2  # past the limit: limit + 1
    assert index.stem_frequency("pod") == 3


@pytest.mark.unit
def test_a_limit_reads_a_common_tokens_rows_a_block_at_a_time():
    """A word in every chunk of a large index: past the limit after its first rows, and without a limit (or under
    it) every holder, across the blocks and across the tokens (here: the stem's words) asked together."""
    from kb_retrieval.retrieval import exact

    chunks = 3 * exact.HOLDERS_BLOCK + 5
    rows = [(f"c{i}", f"d{i // 2}.md", "pods pod" if i % 7 else "pods") for i in range(chunks)]
    index = ExactIdentifierIndex.build(rows)
    converted: list[int] = []

    class Counted(np.ndarray):
        def tolist(self):  # type: ignore[override]
            converted.append(len(self))
            return super().tolist()

    index._rows = index._rows.view(Counted)
    assert index.token_holders("pods", limit=1) is None
    assert converted == [exact.HOLDERS_BLOCK]  # one block read, not the word's every row
    every = index.token_holders("pods")
    assert every is not None and len(every) == (chunks + 1) // 2
    assert sum(len(c) for c in every.values()) == chunks
    documents = (chunks + 1) // 2
    assert index.stem_frequency("pod", limit=documents) == documents  # both words' rows, under the limit
    assert index.stem_frequency("pod", limit=documents - 1) == documents  # past it: limit + 1
