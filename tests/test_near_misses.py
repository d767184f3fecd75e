"""A lookup without evidence names its nearest misses: the best candidate documents below the evidence threshold,
with their similarity, evidence score and the threshold (the CLI, the notebook and the page show them)."""

from __future__ import annotations

import html

from kb_retrieval.terminal import lookup_text

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
