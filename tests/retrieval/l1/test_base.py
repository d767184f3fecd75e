"""``rescored``: the memory plan's copy of a kept candidate is the one pydantic's ``model_copy`` makes."""

from __future__ import annotations

import pytest

from kb_retrieval.models import Candidate, ScoreLabel
from kb_retrieval.retrieval.l1.base import rescored
from kb_retrieval.retrieval.scores import normalised_similarity


@pytest.mark.unit
@pytest.mark.parametrize("label", list(ScoreLabel))
def test_rescored_is_model_copy_with_the_new_score(label: ScoreLabel) -> None:
    kept = Candidate(
        chunk_id="c1",
        source="kube/KubePodCrashLooping.md",
        title="KubePodCrashLooping",
        content="Pod is crash looping.",
        keywords=["crashloop"],  # entities left to their default: the copy records them as set, as model_copy does
        chunk_count=3,
        score=0.5,
        score_label=label,
        path="memory",
        similarity=normalised_similarity(0.5, label),
    )
    copy = rescored(kept, 0.75)
    expected = kept.model_copy(
        update={
            "score": 0.75,
            "similarity": normalised_similarity(0.75, label),
            "keywords": ["crashloop"],
            "entities": [],
        }
    )
    assert copy == expected
    assert list(copy.__dict__) == list(expected.__dict__)  # field order: what a dump writes
    assert copy.model_fields_set == expected.model_fields_set
    assert copy.model_dump_json(by_alias=True) == expected.model_dump_json(by_alias=True)
    assert copy.__pydantic_extra__ is None and copy.__pydantic_private__ is None
    # Its own lists (a stage may extend them) and its own fields: the kept candidate never changes.
    copy.keywords.append("extra")
    copy.score = 0.1
    assert kept.keywords == ["crashloop"] and kept.score == 0.5
