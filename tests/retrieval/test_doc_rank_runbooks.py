"""Document ranking on the real runbooks corpus (../shared/corpora/runbooks), Milvus Lite and the real model.

The questions are in an engineer's own words, written for this test (not from a golden set): no alert name, and a
sibling runbook whose best section is as close as the right one's. Ranked by their best chunks, the sibling comes
first; ranked as wholes (title, summary, text vectors), the right runbook does.
"""

from __future__ import annotations

import json

import numpy as np
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


def test_the_static_signals_leave_out_what_every_runbook_shares(runbooks_lookup):
    """Over the 110 runbooks every static vector leans one way (the words of Kubernetes and Prometheus runbooks): with
    that direction kept, an ops question is as similar to the median runbook as a third of the way to the right one;
    without it, the median runbook is at about 0 and the right one keeps its place among the first."""
    from kb_retrieval.indexing.doc_vectors import DocumentVectors

    question = "packets sent out of the main interface are failing more and more"
    scoring = runbooks_lookup.settings.scoring.model_copy(update={"static_common_min_documents": 0})
    kept = DocumentVectors.load_from_milvus(
        runbooks_lookup.client, runbooks_lookup.settings.model_copy(update={"scoring": scoring})
    )
    removed = runbooks_lookup.doc_vectors
    assert kept.static_common is None and removed.static_common is not None and len(removed) > 100
    right = RUNBOOKS + "node/NodeNetworkTransmitErrs.md"
    for vectors, median_range in ((kept, (0.1, 0.4)), (removed, (-0.05, 0.05))):
        sims = vectors.similarities([1.0] * runbooks_lookup.settings.schema_fields.dim, vectors.sources, question)
        static = np.array([sims[s][3] for s in vectors.sources])
        assert median_range[0] < float(np.median(static)) < median_range[1]
        assert int((static > sims[right][3]).sum()) < 5  # the right runbook among the first five either way
