"""The result's confidence in words: a clear lead, or a close call that names both documents (sibling runbooks
often rank within a few hundredths). Pinned with small fakes, then on the public runbooks corpus."""

from __future__ import annotations

import pytest

from kb_retrieval.models import EvidenceBlock, RetrievalAttempt
from kb_retrieval.result import agent_text, lead_confidence
from kb_retrieval.retrieval.attempts import AttemptResult
from kb_retrieval.retrieval.stage import candidate_node
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
