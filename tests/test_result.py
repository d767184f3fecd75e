"""The lookup result assembled from the attempts (kb_retrieval/result.py).

- Its confidence in words: a clear lead, or a close call that names both documents (sibling runbooks often rank
  within a few hundredths). Pinned with small fakes, then on the public runbooks corpus.
- The blocks the ranking adds below the threshold (``evidence_fills_by_ranking``) reach the context pack, but found,
  relevance and the completeness hint read what they read with the setting off: a fill is context, not evidence.
- A lookup without evidence names its nearest misses: the best candidate documents below the evidence threshold,
  with their similarity, evidence score and the threshold (the CLI, the notebook and the page show them).
"""

from __future__ import annotations

import html

import pytest

from kb_retrieval.models import EvidenceBlock, LookupResult, QueryTransform, RetrievalAttempt
from kb_retrieval.result import agent_text, assemble_result, lead_confidence
from kb_retrieval.retrieval.attempts import AttemptResult, L1Outcome
from kb_retrieval.retrieval.context_pack import pack_context
from kb_retrieval.retrieval.evidence import build_evidence_blocks, is_ranking_fill
from kb_retrieval.retrieval.stage import candidate_node
from kb_retrieval.scoring_profile import BUILT_IN_PROFILE
from kb_retrieval.terminal import lookup_text
from tests.support.candidates import cand


def _attempt(*scores: float) -> tuple[AttemptResult, list[EvidenceBlock]]:
    nodes = []
    for i, score in enumerate(scores):
        node = candidate_node(cand(f"c{i}", f"doc-{i}.md", 0.7))
        node.score = score
        nodes.append(node)
    trace = RetrievalAttempt(attempt=1, filtered=False, query="q", outcome="ok")
    blocks = [EvidenceBlock(source="doc-0.md", content="x", retrieval_layer="L1", score=scores[0], similarity=0.7)]
    return AttemptResult(trace=trace, nodes=nodes, blocks=blocks), blocks


@pytest.mark.unit
def test_a_lead_at_the_margin_is_clear_and_below_it_a_close_call_naming_both():
    assert lead_confidence(*_attempt(2.5, 2.3), margin=0.1).startswith("clear lead: the first document ranks 0.200")
    close = lead_confidence(*_attempt(2.5, 2.45), margin=0.1)
    assert close.startswith("close call: the first two documents rank 0.050 apart")
    assert "doc-0.md and doc-1.md" in close
    assert lead_confidence(*_attempt(2.5), margin=0.1) == "one candidate document"
    attempt, _ = _attempt(2.5, 2.45)
    assert lead_confidence(attempt, [], margin=0.1) == ""  # no evidence, no confidence


def test_sibling_runbooks_are_a_close_call_and_an_alert_name_a_clear_lead(runbooks_lookup):
    close = runbooks_lookup.lookup("the cert kubelet presents to the apiserver expires in 36h per openssl x509")
    assert close.confidence.startswith("close call:")
    assert "KubeletServerCertificateExpiration.md" in close.confidence
    assert "KubeletClientCertificateExpiration.md" in close.confidence
    assert f"Confidence: {close.confidence}." in agent_text(close)
    clear = runbooks_lookup.lookup("KubePodCrashLooping: pod payments/api-7f9 is restarting 3 times / 5 minutes")
    assert clear.confidence.startswith("clear lead:")
    assert not runbooks_lookup.lookup("Route53 queries for app.shopfront.io time out from several regions").confidence


# --- fills by ranking -------------------------------------------------------------------------------------------

THRESHOLD = 0.55
TRANSFORM = QueryTransform(original_query="q", normalized_query="q", filter_reason="test")


def _ranked():
    """d0 answers by an exact identifier at a low similarity; d1 and d2, ranked below it, are under the threshold,
    d1 at a similarity that would make relevance medium were it counted (0.50 >= relevance_medium 0.45)."""
    return [
        candidate_node(cand("c0", "d0.md", 0.30), exact_terms=["ENOTFOUND"]),
        candidate_node(cand("c1", "d1.md", 0.50)),
        candidate_node(cand("c2", "d2.md", 0.20)),
    ]


def _result(fill: bool, budget: int) -> LookupResult:
    nodes = _ranked()
    blocks = build_evidence_blocks(nodes, evidence_threshold=THRESHOLD, max_blocks=5, fill_by_ranking=fill)
    trace = RetrievalAttempt(attempt=1, filtered=False, query="q", outcome="ok")
    l1 = L1Outcome(attempts=[AttemptResult(trace=trace, nodes=nodes, blocks=blocks)])
    pack = pack_context(blocks, budget_tokens=budget)
    return assemble_result(TRANSFORM, l1, pack, scoring=BUILT_IN_PROFILE, l1_enabled=True, stage_ms={})


@pytest.mark.unit
def test_fills_reach_the_pack_but_not_found_relevance_or_completeness():
    off, on = _result(False, 10_000), _result(True, 10_000)
    assert [b.source for b in off.evidence_blocks] == ["d0.md"]
    assert [b.source for b in on.evidence_blocks] == ["d0.md", "d1.md", "d2.md"]
    assert [is_ranking_fill(b) for b in on.evidence_blocks] == [False, True, True]
    assert on.context_pack.summary.included_sources == ["d0.md", "d1.md", "d2.md"]
    assert on.found and off.found
    assert off.relevance_level == on.relevance_level == "low"  # d1's 0.50 is not evidence: not medium
    assert off.completeness_hint == on.completeness_hint
    assert on.completeness_hint.startswith("single_source:")  # one document answers; the others are context


@pytest.mark.unit
def test_a_budget_that_leaves_out_only_fills_did_not_cut_evidence():
    whole = _result(False, 10_000).context_pack.summary.used_tokens
    on = _result(True, whole + 12)  # room for d0 only (12 tokens of content at least): the fills no longer fit
    assert on.context_pack.summary.included_sources == ["d0.md"]
    assert on.context_pack.summary.omitted_sources == ["d1.md", "d2.md"]
    assert on.completeness_hint.startswith("single_source:")


@pytest.mark.unit
def test_without_evidence_the_fill_adds_nothing():
    nodes = [candidate_node(cand("c0", "d0.md", 0.50)), candidate_node(cand("c1", "d1.md", 0.40))]
    assert build_evidence_blocks(nodes, evidence_threshold=THRESHOLD, max_blocks=5) == []


# --- near misses ------------------------------------------------------------------------------------------------

#: The sample KB has no Kafka runbook: the golden set's noanswer-001.
NO_ANSWER = (
    "KafkaConsumerGroupLag: consumer group billing-events lag above 50000 messages on topic invoices partition 3"
)


def test_a_no_evidence_lookup_names_its_nearest_misses(sample_lookup):
    result = sample_lookup.lookup(NO_ANSWER)
    assert not result.found and result.evidence_status.value == "no_evidence"
    misses = result.near_misses
    threshold = sample_lookup.settings.evidence.evidence_threshold
    assert 1 <= len(misses) <= 3
    assert len({m.source for m in misses}) == len(misses)  # each document once
    assert [m.evidence_score for m in misses] == sorted((m.evidence_score for m in misses), reverse=True)
    for miss in misses:
        assert miss.threshold == threshold and miss.evidence_score < threshold
        assert 0.0 <= miss.similarity <= 1.0
    # The nearest miss is the best candidate the attempts recorded (their top similarity, without boosts).
    tops = [a.top_similarity for a in result.retrieval_trace.attempts if a.top_similarity is not None]
    assert max(m.similarity for m in misses) == round(max(tops), 6)
    first = misses[0]
    name = f"{first.title} ({first.source})" if first.title else first.source
    text = lookup_text(result, sample_lookup.settings.scoring)
    assert text.splitlines()[0] == result.message
    assert f"not found: nearest miss {name} at {first.evidence_score:.3f}, threshold {threshold:g}" in text
    page = result._repr_html_()
    assert html.escape(first.source) in page and "nearest miss" in page
    assert result.to_json_dict()["nearMisses"][0]["evidenceScore"] == first.evidence_score


def test_a_found_lookup_has_no_near_misses(sample_lookup):
    result = sample_lookup.lookup("RedisMemoryHigh on cache-01")
    assert result.found and result.near_misses == []
    assert "nearest miss" not in lookup_text(result, sample_lookup.settings.scoring)
