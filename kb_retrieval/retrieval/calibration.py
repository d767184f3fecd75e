"""What ``found`` and relevance ``high`` mean on this knowledge base: thresholds from its own score distribution.

A fixed similarity threshold means different things on different knowledge bases: on the runbooks an unanswerable
question reaches at most ~0.43 against any chunk, on documentation pages in one vocabulary an unanswerable question
about a neighbouring topic reaches 0.5-0.7. So each index version measures the *background*: the similarity a
question in the knowledge base's own vocabulary reaches in a document that does not hold its answer. Pseudo-queries
come from the KB itself: a topical section's heading and first sentence (a heading no other document has: shared
template headings such as "Mitigation" are not a topic), searched against every chunk of the *other* documents.

- ``found``: the evidence threshold is the configured one, or the background's 20th percentile when that is higher
  (a lookup whose best evidence does not beat what a fifth of out-of-document questions reach finds nothing).
- relevance ``high``: the ranking's first document is also the best-matching section's document, among every
  candidate document of the lookup, not only those in the evidence blocks (the ranking and the similarity agree;
  session 27), and its similarity reaches the configured cut-off or the background's 55th percentile when
  higher. (Both quantiles chosen on every public corpus at once: docs/tuning-history.md, session 19.) The lexical
  signal must agree too (:func:`lexical_lead`): the first document's best-matching section is the query's best BM25
  hit or holds a rare identifier of the query. A sibling document that shares the query's vocabulary but not its
  distinctive words (an alert without a runbook found in its sibling's, a neighbouring page) reaches a high
  similarity; the lexical search then puts another section first (session 20). And every identifier name the query
  holds (a metric, flag or alert; not a value: ``exact.is_name``) is held by some document: a name no document holds
  is a specific thing the knowledge base does not document (session 26; ``result.relevance`` checks them all).

Too few topical sections (or no vectors in memory, the milvus plan) keep the configured constants, and the result's
trace says which thresholds were used and why (``retrievalTrace.calibration``). The measurement is deterministic (the
sample is ordered by a hash of the chunk ids), made when a state is loaded (never on a lookup's path), kept with the
state of its index version and in ``<state_dir>/calibration``.

Example:
    >>> Calibration.defaults(0.42, 0.6, 0.45, "no vectors in memory").evidence_threshold
    0.42
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from llama_index.core.schema import NodeWithScore

from kb_retrieval.atomic import atomic_write
from kb_retrieval.config import KBSettings
from kb_retrieval.indexing.embeddings import embed_query
from kb_retrieval.indexing.pseudo_queries import heading_query as pseudo_query
from kb_retrieval.knowledge.chunker import BREADCRUMB_SEPARATOR
from kb_retrieval.retrieval.stage import stage_of

if TYPE_CHECKING:
    from llama_index.core.base.embeddings.base import BaseEmbedding

    from kb_retrieval.retrieval.l1.memory import MemoryMirror

log = logging.getLogger(__name__)

#: Changes when what is measured changes in a way the cache key cannot see.
CACHE_FORMAT = 1
#: Pseudo-queries measured at most (embedding them is most of the cost: 6.6 s at 256 on one loaded core).
MAX_SAMPLES = 256
#: Fewer topical sections than this do not estimate a distribution: the configured constants apply.
MIN_SAMPLES = 20
#: The background's quantiles kept (and reported); FOUND_QUANTILE and HIGH_QUANTILE are among them.
QUANTILES = (0.1, 0.2, 0.25, 0.5, 0.55, 0.75, 0.9)
FOUND_QUANTILE = 0.2
HIGH_QUANTILE = 0.55

#: A relative BM25 score at least this is the query's best lexical hit (relative scores are 1.0 for the best).
BEST_LEXICAL = 0.999

#: Pseudo-queries scored against every chunk at once.
_BLOCK = 32


@dataclass(frozen=True)
class Calibration:
    """The thresholds a lookup on one index version uses, where they came from, and the background measured."""

    source: str
    reason: str
    evidence_threshold: float
    relevance_high: float
    relevance_medium: float
    samples: int = 0
    background: tuple[float, ...] = ()

    @classmethod
    def defaults(cls, evidence: float, high: float, medium: float, reason: str) -> Calibration:
        return cls("settings", reason, evidence, high, medium)

    def as_trace(self) -> dict[str, Any]:
        """What the result's trace records: the thresholds used, their source and why."""
        trace: dict[str, Any] = {
            "source": self.source,
            "reason": self.reason,
            "evidenceThreshold": self.evidence_threshold,
            "relevanceHigh": self.relevance_high,
            "relevanceMedium": self.relevance_medium,
        }
        if self.samples:
            trace["samples"] = self.samples
            trace["background"] = {f"q{round(q * 100)}": v for q, v in zip(QUANTILES, self.background, strict=True)}
        return trace


def lexical_lead(nodes: Sequence[NodeWithScore], source: str) -> bool:
    """Whether the lexical search agrees on ``source``'s best-matching section (the first evidence document's node,
    its best chunk): that chunk is the query's best BM25 hit (relative score 1) or holds a rare identifier or term
    of the query. ``nodes``: the lookup's document nodes, one per document. True when no node has a BM25 score
    (lexical search off: nothing to disagree).

    Example:
        >>> lexical_lead([], "a.md")
        True
    """
    stages = [stage_of(n) for n in nodes]
    if all(s.lexical_score is None and not s.exact_terms for s in stages):
        return True
    first = next((s for s in stages if s.candidate.source == source), None)
    return first is not None and (bool(first.exact_terms) or (first.lexical_score or 0.0) >= BEST_LEXICAL)


def best_similarity(nodes: Sequence[NodeWithScore]) -> float:
    """The best-matching section's similarity among the lookup's document ``nodes`` (every candidate document, not
    only those that became evidence blocks), rounded as an evidence block's is; 0.0 without nodes.

    Example:
        >>> best_similarity([])
        0.0
    """
    # Rounding is monotonic: the best rounded is the best, rounded (one round, not one per candidate).
    return round(max((stage_of(n).candidate.similarity for n in nodes), default=0.0), 6)


def topical_sections(rows: Sequence[dict[str, Any]], settings: KBSettings) -> list[tuple[int, str]]:
    """(row, pseudo-query) of the first chunk of each section whose heading no other document has, in a
    deterministic order (a hash of the chunk id), at most :data:`MAX_SAMPLES`."""
    meta_field, source_field = settings.schema_fields.metadata_field, settings.schema_fields.source_field
    holders: dict[str, set[str]] = {}
    first: dict[tuple[str, str], int] = {}
    for i, row in enumerate(rows):
        meta = (row.get(meta_field) if meta_field else None) or {}
        crumb = str(meta.get("breadcrumb") or "")
        heading = crumb.split(BREADCRUMB_SEPARATOR)[-1].strip().casefold()
        source = str(row.get(source_field) or "")
        if heading:
            holders.setdefault(heading, set()).add(source)
            first.setdefault((source, crumb), i)
    chosen = []
    for (_source, crumb), i in first.items():
        if len(holders[crumb.split(BREADCRUMB_SEPARATOR)[-1].strip().casefold()]) == 1:
            query = pseudo_query(crumb, str(rows[i].get(settings.schema_fields.content_field) or ""))
            if len(query.split()) >= 4:
                chosen.append((i, query))
    chosen.sort(key=lambda item: hashlib.sha1(str(rows[item[0]][settings.schema_fields.id_field]).encode()).hexdigest())
    return chosen[:MAX_SAMPLES]


def background(
    query_vectors: np.ndarray, chunk_vectors: np.ndarray, sources: Sequence[str], own: Sequence[int]
) -> np.ndarray:
    """For each pseudo-query (row ``own[i]``'s section), its best similarity to a chunk of another document."""
    chunks = chunk_vectors / np.maximum(np.linalg.norm(chunk_vectors, axis=1, keepdims=True), 1e-12)
    queries = query_vectors / np.maximum(np.linalg.norm(query_vectors, axis=1, keepdims=True), 1e-12)
    source_ids = np.unique(np.asarray(sources), return_inverse=True)[1]
    own_ids = source_ids[np.asarray(own)]
    best = np.empty(len(queries), dtype=np.float64)
    for start in range(0, len(queries), _BLOCK):  # a block at a time: 256 x 100k similarities would be 100 MB
        sims = queries[start : start + _BLOCK] @ chunks.T
        sims[own_ids[start : start + _BLOCK, None] == source_ids[None, :]] = -1.0
        best[start : start + _BLOCK] = sims.max(axis=1)
    return np.clip(best, 0.0, 1.0)


@dataclass(frozen=True)
class Background:
    """The background of one index version: how many pseudo-queries measured it and its quantiles (none: not
    measured, ``reason`` says why)."""

    samples: int
    quantiles: tuple[float, ...]
    reason: str

    def at(self, q: float) -> float:
        return self.quantiles[QUANTILES.index(q)]


def measure(
    rows: Sequence[dict[str, Any]], vectors: np.ndarray, settings: KBSettings, embed: Callable[[list[str]], np.ndarray]
) -> Background:
    """The background distribution of one index version (``embed``: the query encoder over a list of texts)."""
    sections = topical_sections(rows, settings)
    if len(sections) < MIN_SAMPLES:
        return Background(len(sections), (), f"{len(sections)} topical sections (< {MIN_SAMPLES}): too few to measure")
    own = [i for i, _ in sections]
    sims = background(
        embed([q for _, q in sections]),
        vectors,
        [str(r.get(settings.schema_fields.source_field) or "") for r in rows],
        own,
    )
    quantiles = tuple(round(float(v), 4) for v in np.quantile(sims, QUANTILES))
    return Background(len(sections), quantiles, f"{len(sections)} pseudo-queries searched outside their own document")


def calibrate(measured: Background | None, settings: KBSettings, off_reason: str = "") -> Calibration:
    """The thresholds of ``settings`` on a knowledge base with background ``measured`` (None or unmeasured: the
    configured constants, with the reason)."""
    scoring = settings.scoring
    if not settings.evidence.calibrate_thresholds:
        off_reason = "calibrate_thresholds is off"
    if measured is None or not measured.quantiles or off_reason:
        reason = off_reason or (measured.reason if measured else "not measured")
        return Calibration.defaults(
            settings.evidence.evidence_threshold,
            scoring.relevance_high,
            scoring.relevance_medium,
            f"{reason}: the settings",
        )
    evidence = max(settings.evidence.evidence_threshold, measured.at(FOUND_QUANTILE))
    return Calibration(
        source="measured",
        reason=(
            f"{measured.reason}: found from max(evidence_threshold, background q{round(FOUND_QUANTILE * 100)}), "
            f"high from max(relevance_high, background q{round(HIGH_QUANTILE * 100)}) with the ranking, the best "
            "section and the best lexical hit on the first document, and every identifier name of the query held "
            "by the knowledge base"
        ),
        evidence_threshold=round(evidence, 4),
        relevance_high=round(max(scoring.relevance_high, measured.at(HIGH_QUANTILE)), 4),
        relevance_medium=round(max(scoring.relevance_medium, evidence), 4),
        samples=measured.samples,
        background=measured.quantiles,
    )


def background_of(
    mirror: MemoryMirror | None, settings: KBSettings, encoder: BaseEmbedding | None, version: str
) -> Background:
    """The background of one index version, measured when its state is loaded (off the request path: a reload
    builds the new state beside the old one), or read back from the state dir where it was measured before.
    Without vectors in memory (the milvus plan) or an encoder, nothing is measured and the reason says so."""
    if not settings.evidence.calibrate_thresholds:
        return Background(0, (), "calibrate_thresholds is off")
    if mirror is None:
        return Background(0, (), "no chunk vectors in memory (the milvus plan)")
    if encoder is None:
        return Background(0, (), "no query encoder given to the state loader")
    # Kept on disk per index version (a collection no kb-retrieval ingest versioned is measured every time).
    key = _cache_key(settings, version) if version else ""
    if key and (kept := _read_cached(settings, key)) is not None:
        return kept

    def embed(texts: list[str]) -> np.ndarray:
        return np.asarray([embed_query(encoder, text) for text in texts], dtype=np.float32)

    measured = measure(mirror.rows, mirror.vectors, settings, embed)
    if key:
        _write_cached(settings, key, measured)
    return measured


def _cache_key(settings: KBSettings, version: str) -> str:
    """What the background depends on: the index version, the query model and how it is measured (where the
    collection lives counts as :meth:`~kb_retrieval.config.KBSettings.milvus_location` does: a state dir moved or
    copied whole keeps its calibration)."""
    how = {
        "format": CACHE_FORMAT,
        "version": version,
        "collection": settings.storage.collection,
        "uri": settings.milvus_location(),
        "model": settings.embedding.embed_model,
        "encoder": settings.embedding.query_encoder,
        "samples": [MIN_SAMPLES, MAX_SAMPLES],
        "quantiles": QUANTILES,
    }
    return hashlib.sha256(json.dumps(how, sort_keys=True, default=str).encode()).hexdigest()


def _cache_path(settings: KBSettings) -> Path:
    return settings.storage.state_dir / "calibration" / f"{settings.storage.collection}.json"


def _read_cached(settings: KBSettings, key: str) -> Background | None:
    """The background this state dir measured for ``key`` (an index version) before, or None."""
    if not settings.storage.state_snapshots:
        return None
    try:
        data = json.loads(_cache_path(settings).read_text(encoding="utf-8"))
        if data.get("key") != key:
            return None
        return Background(int(data["samples"]), tuple(float(v) for v in data["quantiles"]), str(data["reason"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_cached(settings: KBSettings, key: str, measured: Background) -> None:
    """Keep the measurement in ``<state_dir>/calibration`` (a temporary file, then a rename; only with
    ``state_snapshots``); a failure only costs the next process the measurement again."""
    if not settings.storage.state_snapshots:
        return
    path = _cache_path(settings)
    record = {"key": key, "samples": measured.samples, "quantiles": measured.quantiles, "reason": measured.reason}
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with atomic_write(path) as handle:
            json.dump(record, handle, sort_keys=True)
    except OSError as exc:
        log.warning("calibration not kept in %s: %s", path.parent, exc)
