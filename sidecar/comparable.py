"""Both paths' rankings in one comparable shape, one document per source.

The main path's ranking (``KnowledgeLookup.lookup_ranked``) is already one candidate per source, ordered by the rule
rerank. The sidecar returns chunks in Milvus order; the same field mapping the main path uses
(:func:`kb_retrieval.retrieval.l1.base.to_candidate`) turns each into a candidate, and the first (best) chunk of each
source is kept.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from llama_index.core.schema import NodeWithScore

from kb_retrieval.config import KBSettings
from kb_retrieval.models import Candidate
from kb_retrieval.retrieval.l1.base import to_candidate
from sidecar.models import PREVIEW_CHARS, SIDECAR_PATH, ComparableResult


def main_path_name(candidate_path: str | None) -> str:
    """The report name of the main path that served, e.g. ``main:sdk``."""
    return f"main:{candidate_path or 'none'}"


def from_main_ranking(ranking: Sequence[Candidate], preview_chars: int = PREVIEW_CHARS) -> list[ComparableResult]:
    """The main path's document ranking (already one per source) as comparable results."""
    return [
        _comparable(candidate, rank, main_path_name(candidate.path), candidate.chunk_id, preview_chars)
        for rank, candidate in enumerate(ranking, start=1)
    ]


def from_sidecar_nodes(
    nodes: Iterable[NodeWithScore], settings: KBSettings, preview_chars: int = PREVIEW_CHARS
) -> list[ComparableResult]:
    """The stock retriever's chunks as comparable results: mapped like the main path's, deduped by source.

    ``NodeWithScore.score`` is the raw value ``MilvusVectorStore`` passed through as "similarity": a similarity
    with COSINE or IP, a squared distance with L2. It keeps the collection metric's label.
    """
    candidates = [
        to_candidate(
            settings,
            chunk_id="",  # the stock retriever gives its nodes fresh ids, not the collection's primary keys
            raw_score=_raw_score(node),
            fields=node.node.metadata,
            content=node.node.get_content(),
            path="vectorstore",
        )
        for node in nodes
    ]
    return [
        _comparable(candidate, rank, SIDECAR_PATH, None, preview_chars)
        for rank, candidate in enumerate(first_per_source(candidates), start=1)
    ]


def _raw_score(node: NodeWithScore) -> float:
    if node.score is None:
        raise ValueError(f"the sidecar retriever returned node {node.node.node_id} without a score")
    return float(node.score)


def first_per_source(candidates: Iterable[Candidate]) -> list[Candidate]:
    """Keep the first candidate of each source, in order (the input is best first)."""
    seen: set[str] = set()
    kept = []
    for candidate in candidates:
        if candidate.source not in seen:
            seen.add(candidate.source)
            kept.append(candidate)
    return kept


def _comparable(
    candidate: Candidate, rank: int, path: str, chunk_id: str | None, preview_chars: int
) -> ComparableResult:
    return ComparableResult(
        path=path,
        rank=rank,
        source=candidate.source,
        chunk_id=chunk_id,
        title=candidate.title,
        breadcrumb=candidate.breadcrumb,
        category=candidate.category,
        content_preview=" ".join(candidate.content.split())[:preview_chars],
        content=candidate.content,
        score_label=candidate.score_label.value,
        score=candidate.score,
    )
