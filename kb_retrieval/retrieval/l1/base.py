"""What every vector-store path returns, and the one place a Milvus hit becomes a :class:`Candidate`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from kb_retrieval.config import Settings
from kb_retrieval.models import Candidate, ScoreLabel
from kb_retrieval.retrieval.scores import normalised_similarity

PathName = Literal["vectorstore", "sdk"]


@dataclass
class L1Search:
    """One L1 search: candidates in Milvus order, the path that served, and why auto fell back if it did."""

    candidates: list[Candidate] = field(default_factory=list)
    path: PathName | None = None
    path_fallback_reason: str | None = None


class VectorPath(Protocol):
    name: str

    def search(self, embedding: list[float], top_k: int, filter_expr: str | None) -> L1Search: ...


def output_fields(settings: Settings) -> list[str]:
    return [settings.content_field, settings.source_field, settings.category_field, settings.metadata_field]


def to_candidate(
    settings: Settings,
    *,
    chunk_id: str,
    raw_score: float,
    fields: dict[str, Any],
    content: str,
    path: PathName,
) -> Candidate:
    """Map one hit's fields into the shared candidate shape, keeping the raw score and its label."""
    label = ScoreLabel.for_metric(settings.metric)
    meta = fields.get(settings.metadata_field) or {}
    return Candidate(
        chunk_id=str(chunk_id),
        source=str(fields.get(settings.source_field) or meta.get("source") or chunk_id),
        title=meta.get("title"),
        breadcrumb=meta.get("breadcrumb"),
        category=fields.get(settings.category_field) or None,
        content=content,
        keywords=list(meta.get("keywords") or []),
        entities=list(meta.get("entities") or []),
        score=float(raw_score),
        score_label=label,
        path=path,
        similarity=normalised_similarity(float(raw_score), label),
    )
