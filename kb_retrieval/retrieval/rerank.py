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
"""

from __future__ import annotations

from typing import Any

from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.schema import NodeWithScore, QueryBundle
from pydantic import Field

from kb_retrieval.knowledge.text import words
from kb_retrieval.models import Candidate, L0Hints
from kb_retrieval.retrieval.l1.retriever import node_candidate

DEFAULT_BOOSTS: dict[str, float] = {
    "l0_title": 0.15,
    "l0_keyword": 0.15,
    "l0_entity": 0.05,
    "l0_category": 0.03,
    "breadcrumb": 0.04,
    "content": 0.04,
    "title_terms": 0.2,
}
RANKING_ONLY = frozenset({"lexical", "title_terms"})  # they order candidates; whether any answers is not theirs


def _phrases(items: list[str]) -> list[tuple[str, ...]]:
    return [p for p in (tuple(words(i)) for i in items) if p]


def _has_phrase(text_words: list[str], phrase: tuple[str, ...]) -> bool:
    n = len(phrase)
    return any(tuple(text_words[i : i + n]) == phrase for i in range(len(text_words) - n + 1))


class RuleReranker(BaseNodePostprocessor):
    """Rerank L1 candidates with L0 hint signals; ``metadata['rerank']`` records base score, boosts, hit reasons."""

    hints: L0Hints = Field(default_factory=L0Hints)
    boosts: dict[str, float] = Field(default_factory=lambda: dict(DEFAULT_BOOSTS))
    lexical_scores: dict[str, float] = Field(default_factory=dict, description="chunk id -> relative BM25 score")
    lexical_weight: float = 0.2

    @classmethod
    def class_name(cls) -> str:
        return "RuleReranker"

    def _postprocess_nodes(
        self, nodes: list[NodeWithScore], query_bundle: QueryBundle | None = None
    ) -> list[NodeWithScore]:
        titles = {t.lower() for t in self.hints.matched_titles}
        keywords = {tuple(words(k)) for k in self.hints.matched_keywords}
        entities = {tuple(words(e)) for e in self.hints.entities}
        domains = {d.lower() for d in self.hints.domains}
        signals = _phrases(self.hints.matched_keywords + self.hints.entities)
        for node in nodes:
            candidate = node_candidate(node)
            applied, reasons = self._signals(candidate, titles, keywords, entities, domains, signals)
            if (lexical := self.lexical_scores.get(candidate.chunk_id)) is not None and self.lexical_weight > 0:
                applied["lexical"] = round(self.lexical_weight * lexical, 6)
                reasons.append(f"lexical_bm25:{lexical:.3f}")
            base = candidate.similarity
            node.score = round(base + sum(applied.values()), 6)
            node.node.metadata["rerank"] = {
                "base_score": round(base, 6),
                # What evidence usability is judged on: BM25 is relative to the query's best hit and title terms
                # are partial word overlap, so they rank candidates but say nothing about whether any answers.
                "evidence_score": round(base + sum(v for k, v in applied.items() if k not in RANKING_ONLY), 6),
                "boosts": applied,
                "hit_reasons": [f"l1_semantic:{base:.3f}", *reasons],
            }
        return sorted(nodes, key=lambda n: (-(n.score or 0.0), n.node.node_id))

    def _signals(
        self,
        c: Candidate,
        titles: set[str],
        keywords: set[tuple[str, ...]],
        entities: set[tuple[str, ...]],
        domains: set[str],
        signals: list[tuple[str, ...]],
    ) -> tuple[dict[str, float], list[str]]:
        applied: dict[str, float] = {}
        reasons: list[str] = []

        def add(name: str, reason: str) -> None:
            applied[name] = self.boosts.get(name, 0.0)
            reasons.append(reason)

        if (coverage := self.hints.title_coverage.get(c.source)) is not None:
            applied["title_terms"] = round(self.boosts.get("title_terms", 0.0) * coverage, 6)
            reasons.append(f"l0_title_terms:{coverage:.2f}")
        if c.title and c.title.lower() in titles:
            add("l0_title", f"l0_title:{c.title}")
        if hit := next((k for k in c.keywords if tuple(words(k)) in keywords), None):
            add("l0_keyword", f"l0_keyword:{hit}")
        if hit := next((e for e in c.entities if tuple(words(e)) in entities), None):
            add("l0_entity", f"l0_entity:{hit}")
        if c.category and c.category.lower() in domains:
            add("l0_category", f"l0_category:{c.category}")
        crumb = words(c.breadcrumb or "")
        if hit_phrase := next((p for p in signals if _has_phrase(crumb, p)), None):
            add("breadcrumb", f"breadcrumb_match:{' '.join(hit_phrase)}")
        body = words(c.content)
        if hit_phrase := next((p for p in signals if _has_phrase(body, p)), None):
            add("content", f"content_match:{' '.join(hit_phrase)}")
        return applied, reasons


def rerank_record(node: NodeWithScore) -> dict[str, Any]:
    return dict(node.node.metadata.get("rerank") or {})
