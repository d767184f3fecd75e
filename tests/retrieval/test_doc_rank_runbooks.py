"""Document ranking on the real runbooks corpus (../shared/corpora/runbooks), Milvus Lite and the real model.

The questions are in an engineer's own words, written for this test (not from a golden set): no alert name, and a
sibling runbook whose best section is as close as the right one's. Ranked by their best chunks, the sibling comes
first; ranked as wholes (title, summary, text vectors), the right runbook does.
"""

from __future__ import annotations

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
    # The same pipeline ranking by best chunks puts a sibling runbook first.
    _, ranking = runbooks_lookup.with_settings(document_ranking=False).lookup_ranked(question)
    sources = [c.source for c in ranking]
    assert RUNBOOKS + expected in sources[1:]  # a candidate, only lower
