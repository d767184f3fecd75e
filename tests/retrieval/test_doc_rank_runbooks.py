"""Document ranking on the real runbooks corpus (../shared/corpora/runbooks), Milvus Lite and the real model.

The questions are in an engineer's own words, written for this test (not from a golden set): no alert name, and a
sibling runbook whose best section is as close as the right one's. Ranked by their best chunks, the sibling comes
first; ranked as wholes (title, summary, text vectors), the right runbook does.
"""

from __future__ import annotations

import json

import pytest

RUNBOOKS = "content/runbooks/"


@pytest.mark.parametrize(
    ("question", "expected"),
    [
        (
            "most of our alertmanager instances are gone and only one replica is still serving",
            "alertmanager/AlertmanagerClusterDown.md",
        ),
        ("packets sent out of the main interface are failing more and more", "node/NodeNetworkTransmitErrs.md"),
    ],
)
def test_a_question_in_own_words_finds_the_runbook_ranked_as_a_whole(runbooks_lookup, question, expected):
    result = runbooks_lookup.lookup(question)
    assert result.found
    top = result.evidence_blocks[0]
    assert top.source == RUNBOOKS + expected
    assert any(reason.startswith("l1_document:title ") for reason in top.hit_reasons)
    entry = result.rerank_trace.entries[0]
    assert entry.final_score == pytest.approx(sum(entry.ranking.values()), abs=1e-5)
    # Ranking by best chunks alone gives another order (the contrast this test asserted until this session: which
    # sibling comes first there moved between fresh ingests of the same corpus, so only the difference is kept).
    _, ranking = runbooks_lookup.with_settings(document_ranking=False).lookup_ranked(question)
    assert [c.source for c in ranking] != [c.source for c in runbooks_lookup.lookup_ranked(question)[1]]


def test_the_agent_reads_the_ranking_first_document_first(runbooks_lookup):
    """Over the public paraphrase set (read from ../shared): whenever a lookup finds evidence, its first block is the
    ranking's first document, as the ranking, trace and fixtures call rank 1. With the threshold alone deciding the
    blocks, some lookups hand the agent a lower-ranked document first (the ranking's first is under the threshold)."""
    from tests.conftest import SHARED

    questions = [
        json.loads(line)["query"]
        for line in (SHARED / "golden" / "runbooks-paraphrase-dev.jsonl").read_text(encoding="utf-8").splitlines()
        if line.strip()
    ]
    strict = runbooks_lookup.with_settings(evidence_follows_ranking=False)
    found = differs = 0
    for question in questions:
        result, ranking = runbooks_lookup.lookup_ranked(question)
        if result.found:
            found += 1
            assert result.evidence_blocks[0].source == ranking[0].source, question
            lead = result.evidence_blocks[0].hit_reasons
            strict_result = strict.lookup(question)
            assert strict_result.found  # the lead never decides whether a lookup finds anything
            if strict_result.evidence_blocks[0].source != ranking[0].source:
                differs += 1
                assert any(r.startswith("l1_rank:ranked 1, above the first evidence") for r in lead)
                assert ranking[0].source not in [b.source for b in strict_result.evidence_blocks]
        else:
            assert not strict.lookup(question).found
    assert found >= 50 and differs >= 1
