"""What every vector-store path returns, and the one place a Milvus hit becomes a :class:`Candidate`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from kb_retrieval.config import KBSettings
from kb_retrieval.models import Candidate, ScoreLabel
from kb_retrieval.retrieval.scores import normalised_similarity

PathName = Literal["vectorstore", "sdk", "memory"]


@dataclass
class L1Search:
    """One L1 search: candidates in Milvus order, the path that served, and why auto fell back if it did."""

    candidates: list[Candidate] = field(default_factory=list)
    path: PathName | None = None
    path_fallback_reason: str | None = None
    #: A hybrid search's BM25 hits: chunk id -> raw BM25 score (Milvus'); empty for a dense search.
    bm25: dict[str, float] = field(default_factory=dict)
    #: Reads by key the search made after it (the rows of hits it returned as ids only and had not kept).
    reads: int = 0


@dataclass(frozen=True)
class HybridRequest:
    """What one ``hybrid_search`` asks for: the top ``top_k`` chunks by the dense metric and the top ``lexical_top_k``
    by BM25 over ``terms`` (an analysed query; no BM25 request when empty), both under ``filter_expr``, and, with
    ``ids_filter`` (``filter_expr`` and an id list of ``ids_count`` chunks: the exact-identifier candidates), those
    chunks by a dense request restricted to them."""

    embedding: list[float]
    terms: str
    top_k: int
    lexical_top_k: int
    filter_expr: str | None
    ids_filter: str | None = None
    ids_count: int = 0


@runtime_checkable
class VectorPath(Protocol):
    """A vector-store path: a dense search with an optional filter expression. The optional features a path may have
    beside it (:class:`HybridPath`, :class:`IdSearchPath`, :class:`FetchPath`) are found once, when the L1 retriever
    is built (:class:`~kb_retrieval.retrieval.l1.retriever.PathFeatures`)."""

    name: str

    def search(
        self, embedding: list[float], top_k: int, filter_expr: str | None, timeout: float | None = None
    ) -> L1Search:
        """``timeout``: seconds this call may take (the lookup's remaining time); ``None``: the path's default."""
        ...


@runtime_checkable
class HybridPath(VectorPath, Protocol):
    """A path that can also send the dense and the BM25 request in one ``hybrid_search`` call
    (:mod:`kb_retrieval.retrieval.l1.full_text`). Paths without ``hybrid_search`` serve the in-process BM25 mode."""

    def hybrid_search(self, request: HybridRequest, timeout: float | None = None) -> L1Search:
        """Dense and BM25 (and the exact-identifier chunks) in one call."""
        ...


@runtime_checkable
class IdSearchPath(VectorPath, Protocol):
    """A path whose dense search can return ids and scores only, the rows then read by key (the sdk path)."""

    def search_ids(
        self, embedding: list[float], top_k: int, filter_expr: str | None, timeout: float | None = None
    ) -> list[tuple[str, float]]:
        """The hits' ids and raw scores, best first."""
        ...

    def read(self, filter_expr: str, timeout: float | None = None) -> list[Candidate]:
        """The rows ``filter_expr`` selects, as candidates to rescore."""
        ...


@runtime_checkable
class SendIdsPath(IdSearchPath, Protocol):
    """A path that can send its ids-only search and be answered later (the sdk path, over gRPC's own future)."""

    def send_ids(
        self, embedding: list[float], top_k: int, filter_expr: str | None, timeout: float | None = None
    ) -> Callable[[], list[tuple[str, float]]]:
        """The request sent now; the call returned waits for the hits (as :meth:`IdSearchPath.search_ids`)."""
        ...


@runtime_checkable
class FetchPath(VectorPath, Protocol):
    """A path that can read chunks by key with their vectors, to score them here."""

    def fetch(self, embedding: list[float], filter_expr: str, timeout: float | None = None) -> tuple[L1Search, Any]:
        """The chunks ``filter_expr`` selects with their dense scores, and their vectors by chunk id."""
        ...


def supports(path: object, feature: type) -> bool:
    """True when ``path`` (and, for a path over two paths, ``auto``, both of them) has ``feature`` (one of the
    feature protocols above)."""
    inner = path.paths() if isinstance(path, TwoPaths) else ()
    if inner:
        return all(supports(p, feature) for p in inner)
    return isinstance(path, feature)


def supports_hybrid(path: object) -> bool:
    """True when ``path`` (and, for a path over two paths, ``auto``, both of them) can serve a hybrid search."""
    return supports(path, HybridPath)


@runtime_checkable
class TwoPaths(Protocol):
    """A path serving through one of two paths (``auto``): it has a feature when both of them have it."""

    def paths(self) -> tuple[object, object]:
        """The preferred path and the fallback."""
        ...


def output_fields(settings: KBSettings) -> list[str]:
    """The fields a search returns with each hit (those the collection has)."""
    fields = [
        settings.schema_fields.content_field,
        settings.schema_fields.source_field,
        settings.schema_fields.category_field,
        settings.schema_fields.metadata_field,
    ]
    fields += [settings.schema_fields.title_field] if settings.schema_fields.title_field not in fields else []
    return [f for f in fields if f]  # "" = the collection has no such field


def to_candidate(
    settings: KBSettings,
    *,
    chunk_id: str,
    raw_score: float,
    fields: dict[str, Any],
    content: str,
    path: PathName,
) -> Candidate:
    """Map one hit's fields into the shared candidate shape, keeping the raw score and its label."""
    label = ScoreLabel.for_metric(settings.schema_fields.metric)
    meta = (fields.get(settings.schema_fields.metadata_field) if settings.schema_fields.metadata_field else None) or {}
    return Candidate(
        chunk_id=str(chunk_id),
        source=str(fields.get(settings.schema_fields.source_field) or meta.get("source") or chunk_id),
        title=meta.get("title") or title_of(settings, fields),
        breadcrumb=meta.get("breadcrumb"),
        category=(fields.get(settings.schema_fields.category_field) if settings.schema_fields.category_field else None)
        or None,
        content=content,
        keywords=list(meta.get("keywords") or []),
        entities=list(meta.get("entities") or []),
        chunk_count=meta.get("chunk_count"),
        position=meta.get("position") if isinstance(meta.get("position"), int) else None,
        score=float(raw_score),
        score_label=label,
        path=path,
        similarity=normalised_similarity(float(raw_score), label),
        doc_hash=meta.get("doc_hash"),
        ingested_at=_number(meta.get("ingested_at")),
    )


def title_of(settings: KBSettings, fields: dict[str, Any]) -> str | None:
    """The title a collection without our metadata field keeps in ``title_field`` (a stock collection's node
    metadata), or None."""
    title = fields.get(settings.schema_fields.title_field) if settings.schema_fields.title_field else None
    return title if isinstance(title, str) and title else None


def rescored(candidate: Candidate, raw_score: float) -> Candidate:
    """``candidate`` with another raw score and the similarity it maps to: what :func:`to_candidate` makes of a hit of
    the same chunk with that score, without reading the hit's fields again (the memory plan keeps one candidate per
    row and rescores it for each search).

    The copy is ``candidate.model_copy(update=...)`` as pydantic makes it (the fields' values, the fields set), made
    directly: a lookup rescores every candidate of every search, and model_copy's Python costs ~3x this.
    """
    score = float(raw_score)
    fields = candidate.__dict__.copy()
    fields["score"] = score
    fields["similarity"] = normalised_similarity(score, candidate.score_label)
    # A candidate's lists are its own (a stage may extend them), never the template's.
    fields["keywords"] = list(candidate.keywords)
    fields["entities"] = list(candidate.entities)
    copy = Candidate.__new__(Candidate)
    _set(copy, "__dict__", fields)
    _set(copy, "__pydantic_fields_set__", candidate.__pydantic_fields_set__ | _RESCORED)
    _set(copy, "__pydantic_extra__", None)  # Candidate takes no extra fields and has no private attributes
    _set(copy, "__pydantic_private__", None)
    return copy


_RESCORED = frozenset({"score", "similarity", "keywords", "entities"})
_set = object.__setattr__


def one_version_per_source(candidates: list[Candidate]) -> list[Candidate]:
    """Only the chunks of one version of each source's document, in the order given.

    Ingest writes an edited document's new chunks before it deletes the old ones (so a reader never finds the
    document missing), which means a search that lands in between can return chunks of both versions. Mixing them
    would show the agent half of each, so one version is kept: the newest (the latest ``ingested_at`` among its
    chunks), or, between versions without that record (rows of an older ingest), the version of the source's
    best-ranked chunk. Chunks without a ``doc_hash`` (a collection written by other tools) are all kept.
    Apply it to every candidate list that merges searches (e.g. dense plus lexical candidates) as well.
    """
    versions: dict[tuple[str, str], tuple[float, int]] = {}  # (source, doc_hash) -> (latest stamp, -first rank)
    for rank, c in enumerate(candidates):
        if c.doc_hash is not None:
            stamp = c.ingested_at if c.ingested_at is not None else float("-inf")
            latest, first = versions.get((c.source, c.doc_hash), (stamp, -rank))
            versions[(c.source, c.doc_hash)] = (max(latest, stamp), first)
    chosen: dict[str, tuple[float, int, str]] = {}
    for (source, doc_hash), (latest, first) in versions.items():
        if source not in chosen or (latest, first) > chosen[source][:2]:
            chosen[source] = (latest, first, doc_hash)
    return [c for c in candidates if c.doc_hash is None or chosen[c.source][2] == c.doc_hash]


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
