"""Which L0 matches narrow L1 to a domain, and when a filtered attempt is low quality: the rules pinned on small
fakes, then the on-call wording that a shared keyword fragment used to send to the wrong domain, on the public
runbooks corpus (real Milvus Lite, the real model)."""

from __future__ import annotations

import pytest

from kb_retrieval.config import KBSettings
from kb_retrieval.models import L0Hints, QueryTransform
from kb_retrieval.retrieval.attempts import _low_quality
from kb_retrieval.retrieval.hybrid import LookupQuery


def _query(hints: L0Hints, category: str) -> LookupQuery:
    transform = QueryTransform(
        original_query="q", normalized_query="q", hints=hints, category_filter=category, filter_reason="test"
    )
    return LookupQuery(query_str="q", transform=transform, category_filter=category)


@pytest.mark.unit
def test_low_quality_when_similarity_is_below_the_reference_threshold() -> None:
    settings = KBSettings(reference_threshold=0.5)
    why = _low_quality(0.41, "redis", _query(L0Hints(domains=["redis"]), "redis"), settings)
    assert why == "top similarity 0.410 below reference_threshold 0.5"
    assert _low_quality(0.62, "redis", _query(L0Hints(domains=["redis"]), "redis"), settings) is None


@pytest.mark.unit
def test_low_quality_when_l0_title_coverage_favours_a_document_outside_the_filter() -> None:
    settings = KBSettings(reference_threshold=0.5)
    hints = L0Hints(
        domains=["prometheus-operator"],
        title_coverage={"k8s/KubeNodeNotReady.md": 0.805, "operator/PrometheusOperatorNotReady.md": 0.52},
        coverage_domain="kubernetes",
    )
    why = _low_quality(0.59, "prometheus-operator", _query(hints, "prometheus-operator"), settings)
    assert why == "L0 title coverage favours k8s/KubeNodeNotReady.md (0.81, domain kubernetes) outside the filter"
    inside = hints.model_copy(update={"coverage_domain": "prometheus-operator"})
    assert _low_quality(0.59, "prometheus-operator", _query(inside, "prometheus-operator"), settings) is None
    tie = hints.model_copy(update={"coverage_domain": None})  # titles of two domains covered alike: no verdict
    assert _low_quality(0.59, "prometheus-operator", _query(tie, "prometheus-operator"), settings) is None


NOT_READY = ["node went NotReady in kubectl get nodes", "kubectl get nodes shows a node NotReady"]


@pytest.mark.parametrize("query", NOT_READY)
def test_not_ready_in_own_words_finds_the_node_runbook_first(runbooks_lookup, query: str) -> None:
    """``NotReady`` is a keyword of "Prometheus Operator NotReady" only, and a piece of KubeNodeNotReady: it used to
    narrow the search to prometheus-operator, where the node runbook is not."""
    result, ranking = runbooks_lookup.lookup_ranked(query)
    assert result.query_transform.category_filter is None, result.query_transform.filter_reason
    assert "NotReady" in result.query_transform.hints.matched_keywords  # still a hint: it boosts its runbook
    assert result.found
    assert ranking[0].source == "content/runbooks/kubernetes/KubeNodeNotReady.md"
    assert result.evidence_blocks[0].source == "content/runbooks/kubernetes/KubeNodeNotReady.md"


def test_an_alert_name_still_sets_its_domain_and_says_so(runbooks_lookup) -> None:
    result = runbooks_lookup.lookup("PrometheusOperatorNotReady is firing in monitoring")
    transform = result.query_transform
    assert transform.category_filter == "prometheus-operator"
    assert "keyword 'PrometheusOperatorNotReady'" in transform.filter_reason
    assert transform.hints.domain_matches["prometheus-operator"] == [
        "keyword 'PrometheusOperatorNotReady' (content/runbooks/prometheus-operator/PrometheusOperatorNotReady.md)"
    ]
    assert result.evidence_blocks[0].source.endswith("PrometheusOperatorNotReady.md")
