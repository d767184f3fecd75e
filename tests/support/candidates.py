"""A small candidate factory for pure-logic tests of the retrieval stages."""

from __future__ import annotations

from kb_retrieval.models import Candidate, ScoreLabel


def cand(chunk_id: str, source: str, similarity: float, chunk_count: int = 4) -> Candidate:
    """A COSINE candidate of the sdk path whose content names its chunk."""
    return Candidate(
        chunk_id=chunk_id,
        source=source,
        content=f"text of {chunk_id}",
        score=similarity,
        score_label=ScoreLabel.COSINE,
        path="sdk",
        similarity=similarity,
        chunk_count=chunk_count,
    )
