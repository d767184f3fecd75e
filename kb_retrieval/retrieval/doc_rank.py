"""Stage 3b': rank the candidate documents as wholes.

After dedupe each node stands for one document. The rule reranker's score (best chunk similarity + boosts) ranks
documents by their best-matching section; a question in an engineer's own words often matches the runbook as a
whole better, and sibling runbooks (``KubeQuotaAlmostFull``, ``KubeQuotaFullyUsed``, ``KubeQuotaExceeded``) differ
mostly in their titles. :class:`DocumentRanker` scores each document with one linear model over

| signal      | value                                               | weight (``KBSettings.scoring``)          |
| ----------- | --------------------------------------------------- | -------------------------------------- |
| doc_title   | query similarity to the document's title vector     | ``rank_title`` 0.75                    |
| doc_summary | ... to its title + opening-section vector           | ``rank_summary`` 0.75                  |
| doc_text    | ... to the mean of its chunk vectors                | ``rank_text`` 1.5                      |
| doc_static  | the static model's similarity of the query to the   | ``rank_static_summary`` 0.5            |
|             | title + opening section (a second model's opinion)  |                                        |
| doc_static_ | ... of the query to the title, both with words      | ``rank_static_title`` 0.75             |
| title       | weighted by their rarity in the knowledge base      |                                        |
| chunk       | the best chunk's similarity                         | ``rank_chunk`` 0                       |
| lexical ... | the boosts: lexical, title_terms, l0, doc_focus,    | ``rank_lexical`` 0.3, ``_title_terms`` |
|             | exact_match                                         | 2.2, ``_l0`` 1.7, ``_doc_focus`` 0.05, |
|             |                                                     | ``_exact_match`` 1                     |

Each knowledge base may change three of these on its own questions (:mod:`kb_retrieval.retrieval.rank_fit`, taught
when an index version is first opened): the best section's weight, its BM25's weight (``lexical``), and a factor on
the identity weights (title, summary, both static); the hit reason ends with the mixture and what chose it.
(``l0`` is the sum of the L0 boosts: title, keyword, entity, category, breadcrumb, content, but the L0 title's
when ``title_terms`` is there too: :func:`l0_signal`.) Both static
similarities leave out the direction every document's static vector shares, from 20 documents up
(``ScoringProfile.static_common_min_documents``; :func:`~kb_retrieval.indexing.doc_vectors.common_direction`).
The weights were fitted on the public golden sets and rounded, but the weighted title's, set to the title vector's
(see ``ScoringProfile``).
The contributions are recorded on the node (``RerankRecord.ranking``, summing to its score) and the document
similarities as an ``l1_document`` hit reason.
From the fourth place on, the order alternates with the documents' content similarity (``doc_text`` alone:
:func:`interleave_by_content`, ``RetrievalSettings.content_interleave``): the first three documents are the linear
model's, and the evidence blocks after them also hold the documents whose whole content is nearest the question,
where one fitted signal (BM25 on documentation) would push them past the blocks. Scores stay the model's; a node
that moved says so in an ``l1_document`` hit reason.
It orders, it never makes a lookup find: whether the knowledge base answers is still judged on the chunks (the
evidence score); once it does, the documents ranked above the first one at the threshold lead the evidence blocks
(``build_evidence_blocks``).

A node whose document has no vectors (a collection from before, or a folder not ingested since) keeps the rule
reranker's order: when any candidate lacks them, the ranker leaves the whole list as it is, rather than mix scores
of two scales, and says so (once in the log, and in each such node's stage notes). Without the query's embedding in
the bundle (a stock ``aquery`` leaves it off) the ranker embeds the query itself with the lookup's query model; a
stock node's absolute ``file_path`` (``SimpleDirectoryReader``) is mapped to the source id relative to the
knowledge-base root recorded at ingest.

Its state (vectors, query model, roots) is private and given when it is built: ``to_dict`` is its configuration
(the weights), and :meth:`DocumentRanker.from_lookup` builds one with a lookup's configuration and state.

Example:
    >>> ranker = DocumentRanker.from_lookup(lookup)  # doctest: +SKIP
    >>> ranked = ranker.postprocess_nodes(deduped, query_str="etcd has no leader")  # doctest: +SKIP
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from llama_index.core.callbacks.schema import EventPayload
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.schema import NodeWithScore, QueryBundle
from pydantic import Field, PrivateAttr

from kb_retrieval.indexing.doc_vectors import DocumentVectors
from kb_retrieval.indexing.embeddings import embed_query
from kb_retrieval.retrieval.events import reranking
from kb_retrieval.retrieval.rank_fit import RankFit, mixture
from kb_retrieval.retrieval.runtime import known_source, note_limitation
from kb_retrieval.retrieval.stage import (
    Boost,
    HitKind,
    HitReason,
    RerankRecord,
    StageData,
    rank_key,
    stage_of,
    write_stage,
)
from kb_retrieval.scoring_profile import BUILT_IN_PROFILE, ScoringProfile

log = logging.getLogger(__name__)

#: The rule reranker's boosts that come from L0 hints (summed into the ``l0`` signal).
L0_BOOSTS = frozenset(
    b.value
    for b in (Boost.L0_TITLE, Boost.L0_KEYWORD, Boost.L0_ENTITY, Boost.L0_CATEGORY, Boost.BREADCRUMB, Boost.CONTENT)
)
_LEXICAL, _TITLE_TERMS = Boost.LEXICAL.value, Boost.TITLE_TERMS.value
_L0_TITLE = Boost.L0_TITLE.value
_DOC_FOCUS, _EXACT_MATCH = Boost.DOC_FOCUS.value, Boost.EXACT_MATCH.value
#: The ranker's signals (the module doc's table), in the order a node's contributions are recorded.
SIGNALS = (
    "doc_title",
    "doc_summary",
    "doc_text",
    "doc_static",
    "doc_static_title",
    "chunk",
    "lexical",
    "title_terms",
    "l0",
    "doc_focus",
    "exact_match",
)


class DocumentRanker(BaseNodePostprocessor):
    """Reorder one-node-per-document candidates by the document-level linear model (see the module doc)."""

    weights: dict[str, float] = Field(
        default_factory=lambda: BUILT_IN_PROFILE.ranking_weights(), description="Signal -> weight."
    )
    mixture: str = Field(
        default="", description="What chose the weights: the knowledge base's own fit (rank_fit), or empty."
    )
    content_interleave: bool = Field(
        default=True,
        description="From the fourth place on, alternate the ranking's order with the documents' content similarity "
        "(doc_text): see interleave_by_content.",
    )
    _vectors: DocumentVectors | None = PrivateAttr(default=None)
    _embed_model: Any = PrivateAttr(default=None)
    _roots: tuple[str, ...] = PrivateAttr(default=())

    def __init__(
        self,
        *,
        vectors: DocumentVectors | None = None,
        embed_model: Any = None,
        roots: Iterable[str] = (),
        **data: Any,
    ) -> None:
        super().__init__(**data)
        self._vectors = vectors
        self._embed_model = embed_model
        self._roots = tuple(roots)

    @classmethod
    def class_name(cls) -> str:
        return "DocumentRanker"

    @classmethod
    def from_lookup(cls, lookup: Any, config: dict[str, Any] | None = None, **fields: Any) -> DocumentRanker:
        """A ranker with ``lookup``'s weights (or ``config``, a ``to_dict()``) and its state: the document vectors,
        the query model (for bundles without an embedding) and the knowledge-base roots recorded at ingest.
        ``fields``: other fields (e.g. ``callback_manager``). The one way the pipeline builds its ranker."""
        state = {
            "vectors": lookup.doc_vectors,
            "embed_model": lookup.query_embed_model,
            "roots": lookup.ingest_record.roots,
            **fields,
        }
        if config is not None:
            return cls.from_dict(config, **state)
        weights, mixture = taught_weights(lookup.settings.scoring, getattr(lookup, "rank_fit", None))
        interleave = lookup.settings.retrieval.content_interleave
        return cls(weights=weights, mixture=mixture, content_interleave=interleave, **state)

    @property
    def vectors(self) -> DocumentVectors | None:
        """The documents' vectors (runtime state, given when built; not configuration)."""
        return self._vectors

    def _postprocess_nodes(
        self, nodes: list[NodeWithScore], query_bundle: QueryBundle | None = None
    ) -> list[NodeWithScore]:
        if not nodes:
            return nodes
        with reranking(self.callback_manager, self.class_name(), nodes, query_bundle) as event:
            ranked = self._rank(nodes, query_bundle)
            event.on_end(payload={EventPayload.NODES: ranked})
        return ranked

    def _rank(self, nodes: list[NodeWithScore], query_bundle: QueryBundle | None) -> list[NodeWithScore]:
        vectors = self.vectors
        component = self.class_name()
        if vectors is None or not vectors.enabled:
            reason = (
                "no document vectors attached" if vectors is None else f"document vectors off: {vectors.off_reason}"
            )
            note_limitation(log, component, "no_vectors", f"{reason}; the order is left as it is", self._staged(nodes))
            return nodes
        embedding = query_bundle.embedding if query_bundle is not None else None
        if not embedding and query_bundle is not None and query_bundle.query_str.strip() and self._embed_model:
            embedding = embed_query(self._embed_model, query_bundle.query_str)
        if not embedding:
            note_limitation(
                log,
                component,
                "no_embedding",
                "no query embedding in the bundle and no query model attached (see from_lookup): the order is left "
                "as it is",
                self._staged(nodes),
            )
            return nodes
        staged = self._staged(nodes)
        roots = self._roots  # a private attribute: read once, not per node (pydantic's __getattr__)
        for _, stage in staged:
            if (known := known_source(stage.candidate, roots)) is not stage.candidate:
                stage.candidate = known
        query_text = query_bundle.query_str if query_bundle is not None else None
        sims = vectors.similarities(embedding, [s.candidate.source for _, s in staged], query_text)
        if missing := [(n, s) for n, s in staged if s.candidate.source not in sims]:
            note_limitation(
                log,
                component,
                "missing_vectors",
                f"no document vectors for {missing[0][1].candidate.source!r} (and {len(missing) - 1} more); "
                "the order is left as it is",
                missing,
            )
            return nodes
        weighted = [(k, wk) for k in SIGNALS if (wk := self.weights.get(k, 0.0))]  # the others contribute nothing
        with_static, with_static_title = vectors.static_model is not None, vectors.static_titles is not None
        weights_note = f"; weights: {self.mixture}" if self.mixture else ""
        content: dict[str, float] = {}
        for node, stage in staged:
            title, summary, text, static, static_title = sims[stage.candidate.source]
            content[node.node.node_id] = text
            record = stage.rerank
            if record is None:
                base = stage.candidate.similarity
                record = stage.rerank = RerankRecord(base_score=base, evidence_score=float(node.score or base))
            boosts = record.boosts
            signals = {
                "doc_title": title,
                "doc_summary": summary,
                "doc_text": text,
                "doc_static": static,
                "doc_static_title": static_title,
                "chunk": record.base_score,
                "lexical": boosts.get(_LEXICAL, 0.0),
                "title_terms": boosts.get(_TITLE_TERMS, 0.0),
                "l0": l0_signal(boosts),
                "doc_focus": boosts.get(_DOC_FOCUS, 0.0),
                "exact_match": boosts.get(_EXACT_MATCH, 0.0),
            }
            record.ranking = _contributions(weighted, signals)
            detail = f"title {title:.3f} summary {summary:.3f} text {text:.3f}"
            if with_static:
                detail += f" static {static:.3f}"
            if with_static_title:
                detail += f" weighted title {static_title:.3f}"
            detail += weights_note
            record.hit_reasons.append(HitReason(kind=HitKind.L1_DOCUMENT, detail=detail))
            node.score = round(sum(record.ranking.values()), 6)
            write_stage(node, stage)
        ranked = sorted(nodes, key=rank_key)
        return self._interleaved(ranked, content) if self.content_interleave else ranked

    @staticmethod
    def _interleaved(ranked: list[NodeWithScore], content: dict[str, float]) -> list[NodeWithScore]:
        """``ranked`` in :func:`interleave_by_content`'s order (``content``: node id -> its document's text
        similarity); each node that moved says so in a hit reason. Scores stay the ranking's."""
        ids = [n.node.node_id for n in ranked]
        was = {i: place for place, i in enumerate(ids, start=1)}
        by_id = dict(zip(ids, ranked, strict=True))
        out = [by_id[i] for i in interleave_by_content(ids, content)]
        for place, node in enumerate(out, start=1):
            if (ranked_at := was[node.node.node_id]) != place:
                stage = stage_of(node)
                if stage.rerank is not None:
                    detail = (
                        f"placed {place}, ranked {ranked_at}: from the fourth place the ranking alternates with "
                        f"content (text {content[node.node.node_id]:.3f})"
                    )
                    stage.rerank.hit_reasons.append(HitReason(kind=HitKind.L1_DOCUMENT, detail=detail))
                    write_stage(node, stage)
        return out

    @staticmethod
    def _staged(nodes: list[NodeWithScore]) -> list[tuple[NodeWithScore, StageData]]:
        return [(n, stage_of(n)) for n in nodes]


#: The ranking's first places that keep their documents (:func:`interleave_by_content`).
INTERLEAVE_AFTER = 3


def interleave_by_content(ranked: list[str], content: dict[str, float], lead: int = INTERLEAVE_AFTER) -> list[str]:
    """``ranked`` (ids, the ranking's order) with its first ``lead`` kept and the rest alternating: the best
    remaining document by ``content`` (its similarity to the query by the mean of its chunk vectors), then the
    ranking's next, and so on (ties by the ranking's order).

    The ranking's weights are a linear mixture fitted per knowledge base (:mod:`~kb_retrieval.retrieval.rank_fit`);
    where one signal decides (a documentation KB fits BM25's weight at 16), a document whose content is nearest the
    question but whose best section shares few words with it falls past the evidence blocks. The whole-content
    vector is the one document signal no fit re-weights (the stock "dense whole documents" view), so the places
    after the ranking's first three alternate with it: the agent's first documents are the ranking's, and the
    evidence also holds the content's nearest. Measured in docs/tuning-history.md (session 27).

    Example:
        >>> interleave_by_content(["a", "b", "c", "d", "e"], {"a": 0.1, "b": 0.2, "c": 0.3, "d": 0.1, "e": 0.9})
        ['a', 'b', 'c', 'e', 'd']
    """
    out = ranked[:lead]
    placed = set(out)
    position = {i: p for p, i in enumerate(ranked)}
    by_content = sorted(ranked, key=lambda i: (-content.get(i, 0.0), position[i]))
    sources = (iter(by_content), iter(ranked))
    while len(out) < len(ranked):
        for source in sources:
            for i in source:
                if i not in placed:
                    out.append(i)
                    placed.add(i)
                    break
    return out


def _contributions(weighted: list[tuple[str, float]], signals: dict[str, float]) -> dict[str, float]:
    """Signal -> weight x value, for the signals of non-zero weight (``weighted``, in :data:`SIGNALS` order) and
    non-zero value: a node's ``RerankRecord.ranking``, which sums to its score."""
    return {k: round(wk * v, 6) for k, wk in weighted if (v := signals[k])}


def l0_signal(boosts: dict[str, float]) -> float:
    """The ``l0`` signal: the sum of the L0 boosts in ``boosts`` (a :class:`RerankRecord`'s), leaving out the L0
    title's when the ``title_terms`` boost is there too.

    Both reward the query naming the document's title (the L0 title hit, and the title's terms covered one by one):
    summed, the title counted twice. Without ``title_terms`` the L0 title hit counts as before.

    Example:
        >>> l0_signal({"l0_title": 0.3, "l0_keyword": 0.1, "title_terms": 0.2})
        0.1
        >>> l0_signal({"l0_title": 0.3, "l0_keyword": 0.1})
        0.4
    """
    twice = _L0_TITLE if boosts.get(_TITLE_TERMS) else None
    return sum(v for k, v in boosts.items() if k in L0_BOOSTS and k != twice)


def taught_weights(scoring: ScoringProfile, fit: RankFit | None) -> tuple[dict[str, float], str]:
    """The ranking weights of ``scoring`` with the mixture the knowledge base chose (``fit``, when
    ``scoring.fit_ranking``), and a note of what chose them for the trace ("" without a fit).

    A fit taught under other inputs (``RankFit.taught_under``: a ``with_settings(scoring=...)`` variant of a lookup
    whose fit was taught under the lookup's own profile) is not applied: its choice was made against other weights
    or on another sample, so the variant ranks with its own weights as set, and the note says why.
    """
    weights = scoring.ranking_weights()
    if fit is None or not scoring.fit_ranking:
        return weights, ""
    if fit.taught_under and fit.taught_under != scoring.fit_inputs():
        return weights, "as set (the knowledge base's fit was taught under other ranking weights or sample sizes)"
    if not fit.fitted:
        return weights, f"as set ({fit.reason})"
    return mixture(weights, fit.section_weight, fit.identity_scale, fit.lexical_weight), fit.describe()
