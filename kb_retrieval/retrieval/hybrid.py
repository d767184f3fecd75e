"""Stage 2: the hybrid L1 step, a LlamaIndex ``BaseRetriever``: dense search in Milvus, BM25 beside it, and the
lexical hits the dense search missed scored by Milvus, so every candidate carries one comparable similarity.

``search`` is the pipeline's call (embedding, filter and deadline given; what happened is returned for the trace).
``retrieve`` is the ordinary face: a :class:`LookupQuery` carries the lookup's context (its transform, hence the
category filter); a plain ``QueryBundle`` searches unfiltered. Nodes carry their stage data (candidate, BM25 score).

Example:
    >>> nodes = lookup.hybrid.retrieve("redis memory high")  # doctest: +SKIP
    >>> stage_of(nodes[0]).lexical_score  # doctest: +SKIP
    1.0
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.schema import NodeWithScore, QueryBundle

from kb_retrieval.config import Settings
from kb_retrieval.indexing.embeddings import embed_query
from kb_retrieval.models import Candidate, QueryTransform
from kb_retrieval.retrieval.deadline import Deadline
from kb_retrieval.retrieval.exact import ExactIdentifierIndex
from kb_retrieval.retrieval.l1.base import one_version_per_source
from kb_retrieval.retrieval.l1.retriever import L1Retriever
from kb_retrieval.retrieval.lexical import LexicalIndex
from kb_retrieval.retrieval.stage import candidate_node
from kb_retrieval.retrieval.timing import StageClock

log = logging.getLogger(__name__)
dispatcher = get_dispatcher(__name__)


@dataclass
class LookupQuery(QueryBundle):
    """A ``QueryBundle`` with the lookup's context: postprocessors read the L0 hints and filter from it."""

    transform: QueryTransform | None = None
    category_filter: str | None = None
    deadline: Deadline | None = None


@dataclass
class HybridSearch:
    """One hybrid search: candidates in dense order then lexical additions, and what each signal did."""

    candidates: list[Candidate] = field(default_factory=list)
    lexical_scores: dict[str, float] = field(default_factory=dict)
    exact_terms: dict[str, list[str]] = field(default_factory=dict)  # chunk id -> rare query identifiers it holds
    exact_df: dict[str, int] = field(default_factory=dict)  # chunk id -> documents holding its rarest identifier
    path: str | None = None
    path_fallback_reason: str | None = None
    lexical_count: int = 0
    lexical_added: int = 0

    def nodes(self) -> list[NodeWithScore]:
        return [
            candidate_node(
                c,
                lexical_score=self.lexical_scores.get(c.chunk_id),
                exact_terms=self.exact_terms.get(c.chunk_id, []),
                exact_df=self.exact_df.get(c.chunk_id),
            )
            for c in self.candidates
        ]


class HybridRetriever(BaseRetriever):
    """Dense (one vector-store path) plus lexical (BM25) and exact-identifier candidates, all scored by Milvus."""

    def __init__(
        self,
        dense: L1Retriever,
        lexical: LexicalIndex | None,
        settings: Settings,
        exact: ExactIdentifierIndex | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.dense = dense
        self.lexical = lexical
        self.exact = exact
        self.settings = settings

    def search(
        self,
        embedding: list[float],
        query_text: str,
        category: str | None = None,
        deadline: Deadline | None = None,
        stage_ms: dict[str, float] | None = None,
    ) -> HybridSearch:
        """Raises when the dense search fails (the attempt fails); a failed lexical scoring only loses those."""
        settings = self.settings
        deadline = deadline or Deadline.after(settings.lookup_timeout_s)
        clock = StageClock(stage_ms)
        with clock("search"):
            dense = self.dense.search(embedding, category, timeout=deadline.timeout(settings.milvus_search_timeout_s))
        result = HybridSearch(
            candidates=dense.candidates, path=dense.path, path_fallback_reason=dense.path_fallback_reason
        )
        missing: list[str] = []
        known = {c.chunk_id for c in result.candidates}
        if self.exact is not None and settings.scoring.exact_match_max_df > 0:
            for hit in self.exact.match(query_text, settings.scoring.exact_match_max_df):
                for chunk_id in hit.chunk_ids:
                    result.exact_terms.setdefault(chunk_id, []).append(hit.token)
                    result.exact_df[chunk_id] = min(result.exact_df.get(chunk_id, len(hit.sources)), len(hit.sources))
            missing += [c for c in result.exact_terms if c not in known]
        if self.lexical is not None and settings.lexical_top_k > 0:
            with clock("lexical"):
                hits = self._lexical(query_text, category)
            result.lexical_scores = {h.chunk_id: h.score for h in hits}
            result.lexical_count = len(hits)
            missing += [
                h.chunk_id
                for h in hits
                if h.chunk_id not in known and h.score >= settings.lexical_rescore_min and h.chunk_id not in missing
            ]
        result.lexical_added = len(missing)
        if missing and not deadline.expired:  # Milvus scores the lexical candidates the dense search did not return
            try:
                with clock("search"):
                    extra = self.dense.search(
                        embedding,
                        category,
                        ids=missing,
                        timeout=deadline.timeout(settings.milvus_search_timeout_s),
                    )
                result.candidates = one_version_per_source(result.candidates + extra.candidates)
            except Exception as exc:  # the dense candidates still stand
                log.warning("scoring lexical candidates failed: %s", exc)
        return result

    @dispatcher.span
    def _lexical(self, query_text: str, category: str | None) -> list[Any]:
        assert self.lexical is not None
        return self.lexical.search(query_text, self.settings.lexical_top_k, category)

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        embedding = query_bundle.embedding or embed_query(self.dense.embed_model, query_bundle.query_str)
        category = query_bundle.category_filter if isinstance(query_bundle, LookupQuery) else None
        return self.search(embedding, query_bundle.query_str, category).nodes()
