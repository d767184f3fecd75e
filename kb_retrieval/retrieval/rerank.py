"""Stage 3a: a deterministic rule reranker that records every contribution.

Final score = the normalised semantic similarity + named boosts, each added when an L0 hint matches the
candidate's metadata or content. The hint becomes a *hit reason* on the candidate; it is never evidence itself.

| boost         | when                                                               | default |
| ------------- | ------------------------------------------------------------------ | ------- |
| l0_title      | the candidate's document title was matched by L0                   | 0.15    |
| l0_keyword    | one of the document's frontmatter keywords was matched by L0       | 0.15    |
| l0_entity     | one of the document's entities was matched by L0                   | 0.05    |
| l0_category   | the candidate's category is one of the L0 domains                  | 0.03    |
| breadcrumb    | a matched keyword or entity occurs in the candidate's breadcrumb   | 0.04    |
| content       | a matched keyword or entity occurs in the candidate's text         | 0.04    |
| title_terms   | the query holds much of the document's title, term by term:        | 0.2     |
|               | ``title_terms`` x the L0 title coverage (0.5 to 1.0)               |         |
| lexical       | BM25 found the chunk: ``lexical_weight`` x its BM25 score relative | 0.2     |
|               | to the query's best lexical hit (1.0 for the best)                 |         |
| exact_match   | the chunk holds a rare identifier or rare term of the query        | 0.6     |
|               | verbatim: the weight / the documents holding it                    |         |
|               | (:mod:`~kb_retrieval.retrieval.exact`); evidence on its own        |         |

The weights are the scoring profile's boosts (``KBSettings.scoring``, :mod:`kb_retrieval.scoring_profile`) and the
``lexical_weight`` setting. The per-query context comes
with the call: a :class:`~kb_retrieval.retrieval.hybrid.LookupQuery` carries the L0 hints of the lookup; with a
plain ``QueryBundle`` (a stock pipeline) the hints are computed from the query string by the ``l0`` provider when
one is configured. Nodes of any retriever are accepted (see :func:`~kb_retrieval.retrieval.stage.stage_of`).

Example:
    >>> reranker = RuleReranker.from_lookup(lookup)  # doctest: +SKIP
    >>> VectorStoreIndex(nodes).as_query_engine(node_postprocessors=[reranker])  # doctest: +SKIP
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from functools import lru_cache
from typing import Any

from llama_index.core.callbacks.schema import EventPayload
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.events.rerank import ReRankEndEvent, ReRankStartEvent
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.schema import NodeWithScore, QueryBundle
from pydantic import Field, PrivateAttr

from kb_retrieval.knowledge.text import words
from kb_retrieval.models import Candidate, L0Hints
from kb_retrieval.retrieval.events import listening, reranking
from kb_retrieval.retrieval.exact import is_identifier
from kb_retrieval.retrieval.hybrid import LookupQuery
from kb_retrieval.retrieval.l0_hints import L0HintProvider
from kb_retrieval.retrieval.runtime import known_source, note_limitation
from kb_retrieval.retrieval.stage import (
    RANKING_ONLY,
    Boost,
    HitKind,
    HitReason,
    RerankRecord,
    hit_reason,
    rank_key,
    stage_of,
    write_stage,
)
from kb_retrieval.scoring_profile import BUILT_IN_PROFILE

dispatcher = get_dispatcher(__name__)
log = logging.getLogger(__name__)


#: Boost names as the records key them, looked up once rather than per candidate.
_EXACT_MATCH, _LEXICAL, _TITLE_TERMS = Boost.EXACT_MATCH.value, Boost.LEXICAL.value, Boost.TITLE_TERMS.value
_L0_TITLE, _L0_KEYWORD, _L0_ENTITY = Boost.L0_TITLE.value, Boost.L0_KEYWORD.value, Boost.L0_ENTITY.value
_L0_CATEGORY, _BREADCRUMB, _CONTENT = Boost.L0_CATEGORY.value, Boost.BREADCRUMB.value, Boost.CONTENT.value
_BOOST_NAMES = tuple(b.value for b in Boost)


@lru_cache(maxsize=16384)
def _phrase(text: str) -> tuple[str, ...]:
    """``text``'s words as a tuple; a candidate's keywords and entities recur on every lookup (split once each)."""
    return tuple(words(text))


def _phrases(items: list[str]) -> list[tuple[str, ...]]:
    return [p for p in (_phrase(i) for i in items) if p]


def _has_phrase(text_words: list[str], phrase: tuple[str, ...]) -> bool:
    n = len(phrase)
    return any(tuple(text_words[i : i + n]) == phrase for i in range(len(text_words) - n + 1))


class RuleReranker(BaseNodePostprocessor):
    """Rerank candidates with L0 hint and lexical signals; each node's stage data records base score, boosts and
    hit reasons."""

    boosts: dict[str, float] = Field(
        default_factory=lambda: BUILT_IN_PROFILE.boosts(), description="Boost name -> weight (the scoring profile's)."
    )
    lexical_weight: float = Field(default=0.2, ge=0, le=1, description="Boost of the best BM25 hit.")
    _l0: L0HintProvider | None = PrivateAttr(default=None)
    _roots: tuple[str, ...] = PrivateAttr(default=())

    def __init__(self, *, l0: L0HintProvider | None = None, roots: Iterable[str] = (), **data: Any) -> None:
        super().__init__(**data)
        self._l0 = l0
        self._roots = tuple(roots)

    @classmethod
    def class_name(cls) -> str:
        return "RuleReranker"

    @classmethod
    def from_lookup(cls, lookup: Any, config: dict[str, Any] | None = None, **fields: Any) -> RuleReranker:
        """A reranker with ``lookup``'s boosts (or ``config``, a ``to_dict()``) and its state: the L0 index (hints
        for stock bundles) and the knowledge-base roots recorded at ingest (for stock nodes' ``file_path``).
        ``fields``: other fields (e.g. ``callback_manager``). The one way the pipeline builds its reranker."""
        state = {"l0": lookup.l0, "roots": lookup.ingest_record.roots, **fields}
        if config is not None:
            return cls.from_dict(config, **state)
        s = lookup.settings
        return cls(boosts=s.scoring.boosts(), lexical_weight=s.lexical_weight, **state)

    @property
    def l0(self) -> L0HintProvider | None:
        """Computes hints when the query bundle carries none (runtime state, given when built; not configuration)."""
        return self._l0

    def hints_for(self, query_bundle: QueryBundle | None) -> L0Hints:
        """The lookup's hints when the bundle carries them; else computed by ``l0``; else none."""
        if isinstance(query_bundle, LookupQuery) and query_bundle.transform is not None:
            return query_bundle.transform.hints
        if query_bundle is not None and self.l0 is not None and query_bundle.query_str.strip():
            return self.l0.hints(query_bundle.query_str)
        return L0Hints()

    def _postprocess_nodes(
        self, nodes: list[NodeWithScore], query_bundle: QueryBundle | None = None
    ) -> list[NodeWithScore]:
        heard = listening(dispatcher)  # else the events are not built (see events.lookup_retrieval)
        if heard:
            dispatcher.event(
                ReRankStartEvent(query=query_bundle, nodes=nodes, top_n=len(nodes), model_name=self.class_name())
            )
        with reranking(self.callback_manager, self.class_name(), nodes, query_bundle) as event:
            ranked = self._rerank(nodes, query_bundle)
            event.on_end(payload={EventPayload.NODES: ranked})
        if heard:
            dispatcher.event(ReRankEndEvent(nodes=ranked))
        return ranked

    def _rerank(self, nodes: list[NodeWithScore], query_bundle: QueryBundle | None) -> list[NodeWithScore]:
        if self.l0 is None and not (isinstance(query_bundle, LookupQuery) and query_bundle.transform is not None):
            message = "no L0 hints (no L0 index attached, see from_lookup): similarity and lexical signals only"
            note_limitation(log, self.class_name(), "no_l0", message, [(n, stage_of(n)) for n in nodes])
        rules = _MatchRules(self.hints_for(query_bundle), self.boosts)
        exact_weight = self.boosts.get(_EXACT_MATCH, 0.0)
        lexical_weight = self.lexical_weight
        semantic = HitKind.L1_SEMANTIC
        for node in nodes:
            stage = stage_of(node)
            candidate = stage.candidate
            if candidate.path == "external" and (known := self._known(candidate)) is not candidate:
                candidate = stage.candidate = known
            applied, reasons = rules.signals_of(candidate)
            if stage.exact_terms and exact_weight > 0:
                applied[_EXACT_MATCH] = round(exact_weight / (stage.exact_df or 1), 6)
                reasons += [
                    hit_reason(HitKind.EXACT_MATCH if is_identifier(t) else HitKind.RARE_TERM, t)
                    for t in stage.exact_terms
                ]
            if (lexical := stage.lexical_score) is not None and lexical_weight > 0:
                applied[_LEXICAL] = round(lexical_weight * lexical, 6)
                reasons.append(hit_reason(HitKind.LEXICAL_BM25, f"{lexical:.3f}"))
            base = candidate.similarity
            score = round(base + sum(applied.values()), 6)
            node.score = score
            # Validated, not ``model_construct``ed: pydantic's construct is Python, 5x the cost of this validation.
            stage.rerank = RerankRecord(
                base_score=round(base, 6),
                # What evidence usability is judged on: BM25 is relative to the query's best hit and title terms
                # are partial word overlap, so they rank candidates but say nothing about whether any answers.
                # Without a ranking-only boost it is the score (the same sum, in the same order).
                evidence_score=score
                if RANKING_ONLY.isdisjoint(applied)
                else round(base + sum(v for k, v in applied.items() if k not in RANKING_ONLY), 6),
                boosts=applied,
                hit_reasons=[hit_reason(semantic, f"{base:.3f}"), *reasons],
            )
            write_stage(node, stage)
        return sorted(nodes, key=rank_key)

    def _known(self, c: Candidate) -> Candidate:
        """A stock node of a document the L0 index knows gets that document's title, keywords, entities, category
        (and, under a recorded root, the document's source id)."""
        if c.path != "external":  # the pipeline's own candidates carry all of it (the caller skips them)
            return c
        c = known_source(c, self._roots)
        if self.l0 is None or (entry := self.l0.index.documents.get(c.source)) is None:
            return c
        return c.model_copy(
            update={
                "title": entry.title,
                "keywords": c.keywords or entry.keywords,
                "entities": c.entities or entry.entities,
                "category": c.category or entry.category,
            }
        )


class _MatchRules:
    """One lookup's hints as the rule reranker matches them against each candidate, with the boosts' weights: built
    once per call, so the per-candidate work is only the matching itself."""

    __slots__ = ("coverage", "domains", "entities", "keywords", "phrases", "titles", "weights")

    def __init__(self, hints: L0Hints, boosts: dict[str, float]) -> None:
        self.coverage = hints.title_coverage
        self.titles = {t.lower() for t in hints.matched_titles}
        self.keywords = {_phrase(k) for k in hints.matched_keywords}
        self.entities = {_phrase(e) for e in hints.entities}
        self.domains = {d.lower() for d in hints.domains}
        self.phrases = _phrases(hints.matched_keywords + hints.entities)
        self.weights = {name: boosts.get(name, 0.0) for name in _BOOST_NAMES}

    def signals_of(self, c: Candidate) -> tuple[dict[str, float], list[HitReason]]:
        """The L0 and title-term boosts ``c`` earns, by name, and their hit reasons (in the records' order)."""
        applied: dict[str, float] = {}
        reasons: list[HitReason] = []
        weights = self.weights
        if (coverage := self.coverage.get(c.source)) is not None:
            applied[_TITLE_TERMS] = round(weights[_TITLE_TERMS] * coverage, 6)
            reasons.append(hit_reason(HitKind.L0_TITLE_TERMS, f"{coverage:.2f}"))
        if self.titles and c.title and c.title.lower() in self.titles:
            applied[_L0_TITLE] = weights[_L0_TITLE]
            reasons.append(hit_reason(HitKind.L0_TITLE, c.title))
        if self.keywords and (hit := next((k for k in c.keywords if _phrase(k) in self.keywords), None)):
            applied[_L0_KEYWORD] = weights[_L0_KEYWORD]
            reasons.append(hit_reason(HitKind.L0_KEYWORD, hit))
        if self.entities and (hit := next((e for e in c.entities if _phrase(e) in self.entities), None)):
            applied[_L0_ENTITY] = weights[_L0_ENTITY]
            reasons.append(hit_reason(HitKind.L0_ENTITY, hit))
        if self.domains and c.category and c.category.lower() in self.domains:
            applied[_L0_CATEGORY] = weights[_L0_CATEGORY]
            reasons.append(hit_reason(HitKind.L0_CATEGORY, c.category))
        if not self.phrases:  # no matched keyword or entity to look for (most lookups)
            return applied, reasons
        if hit_phrase := _first_phrase_in(c.breadcrumb or "", self.phrases):
            applied[_BREADCRUMB] = weights[_BREADCRUMB]
            reasons.append(hit_reason(HitKind.BREADCRUMB_MATCH, " ".join(hit_phrase)))
        if hit_phrase := _first_phrase_in(c.content, self.phrases):
            applied[_CONTENT] = weights[_CONTENT]
            reasons.append(hit_reason(HitKind.CONTENT_MATCH, " ".join(hit_phrase)))
        return applied, reasons


def _first_phrase_in(text: str, phrases: list[tuple[str, ...]]) -> tuple[str, ...] | None:
    """The first of ``phrases`` that occurs in ``text`` word for word, or None.

    Splitting a chunk into words is the costly part, so it is skipped when a substring test already rules every
    phrase out: exact for ASCII text, where lower-casing works letter by letter (other text is always split).
    """
    if not phrases:
        return None
    if (lowered := _ascii_lowered(text)) is not None:
        phrases = [p for p in phrases if all(word in lowered for word in p)]
        if not phrases:
            return None
    text_words = words(text)
    return next((p for p in phrases if _has_phrase(text_words, p)), None)


@lru_cache(maxsize=4096)
def _ascii_lowered(text: str) -> str | None:
    """``text`` lower-cased when it is ASCII, else None: a chunk's text recurs across lookups (lowered once each)."""
    return text.lower() if text.isascii() else None
