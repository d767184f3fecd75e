"""One lookup pipeline, built from ``(settings, state)`` and never changed: the L1 retrievers and the postprocessors.

A :class:`Pipeline` is what a lookup runs through after its query transform: the dense L1 retriever over the
vector-store path (or the memory plan's mirror), the hybrid retriever adding BM25 and exact-identifier candidates,
and the node postprocessors (rerank, dedupe, document ranking, document expansion), run by the attempt runner.
Every stage gets what it reads when it is built: the settings, and the parts of one
:class:`~kb_retrieval.state.RetrievalState` (one index version). Nothing is assigned into a built stage; a new index
version, or other settings, get a new pipeline, and a lookup keeps the one it started with to its end.

The postprocessors are built only by their own ``from_lookup`` factories (the same a stock LlamaIndex pipeline
uses), from a :class:`StageInputs`, the face of a lookup those factories read.

Example:
    >>> pipeline = Pipeline.build(settings, holder.current, resources)  # doctest: +SKIP
    >>> pipeline.attempts.run(query, embedding, deadline, clock)  # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kb_retrieval.config import KBSettings
from kb_retrieval.indexing.doc_vectors import DocumentVectors
from kb_retrieval.indexing.ingest_record import IngestRecord
from kb_retrieval.models import LexicalMode
from kb_retrieval.retrieval.attempts import AttemptRunner
from kb_retrieval.retrieval.calibration import calibrate
from kb_retrieval.retrieval.dedupe import SourceDeduplicator
from kb_retrieval.retrieval.doc_rank import DocumentRanker
from kb_retrieval.retrieval.expand import DocumentExpander, SectionStore
from kb_retrieval.retrieval.hybrid import HybridRetriever
from kb_retrieval.retrieval.l0_hints import L0HintProvider
from kb_retrieval.retrieval.l1 import L1Retriever, VectorPath
from kb_retrieval.retrieval.rank_fit import RankFit
from kb_retrieval.retrieval.rerank import RuleReranker
from kb_retrieval.state import RetrievalState

if TYPE_CHECKING:
    from llama_index.core.base.embeddings.base import BaseEmbedding
    from llama_index.core.callbacks import CallbackManager
    from llama_index.core.postprocessor.types import BaseNodePostprocessor

__all__ = ["Pipeline", "Resources", "StageInputs"]


@dataclass(frozen=True)
class Resources:
    """What a lookup object connects to once and every pipeline of it shares, whatever the index version: the
    vector-store path, the query model, the section store, what ingest recorded, and where BM25 runs."""

    path: VectorPath
    query_embed_model: BaseEmbedding
    sections: SectionStore
    ingest_record: IngestRecord
    lexical_mode: LexicalMode


@dataclass(frozen=True)
class StageInputs:
    """What the postprocessors' ``from_lookup`` factories read of a lookup: its settings and state."""

    settings: KBSettings
    l0: L0HintProvider
    doc_vectors: DocumentVectors | None
    rank_fit: RankFit | None
    query_embed_model: BaseEmbedding
    ingest_record: IngestRecord
    sections: SectionStore


@dataclass(frozen=True)
class Pipeline:
    """The stages of one ``(settings, state)``, built once (:meth:`build`)."""

    settings: KBSettings
    state: RetrievalState
    dense: L1Retriever
    hybrid: HybridRetriever
    postprocessors: tuple[BaseNodePostprocessor, ...]
    attempts: AttemptRunner

    @classmethod
    def build(
        cls,
        settings: KBSettings,
        state: RetrievalState,
        resources: Resources,
        *,
        callback_manager: CallbackManager | None = None,
    ) -> Pipeline:
        """The pipeline of ``settings`` over ``state``; ``callback_manager``: the postprocessors report to it."""
        dense = L1Retriever(resources.path, settings, resources.query_embed_model, memory=state.memory)
        hybrid = HybridRetriever(
            dense,
            state.lexical,
            settings,
            exact=state.exact,
            named_terms=state.named_terms,
            lexical_mode=resources.lexical_mode if settings.retrieval.lexical_enabled else "off",
        )
        inputs = StageInputs(
            settings=settings,
            l0=state.l0,
            doc_vectors=state.doc_vectors,
            rank_fit=state.rank_fit,
            query_embed_model=resources.query_embed_model,
            ingest_record=resources.ingest_record,
            sections=resources.sections.over(dense.mirror_for(None)),  # the mirror's rows on the memory plan
        )
        fields: dict[str, Any] = {"callback_manager": callback_manager} if callback_manager is not None else {}
        postprocessors = (
            RuleReranker.from_lookup(inputs, **fields),
            SourceDeduplicator.from_lookup(inputs, **fields),
            *([DocumentRanker.from_lookup(inputs, **fields)] if settings.retrieval.document_ranking else []),
            DocumentExpander.from_lookup(inputs, **fields),
        )
        attempts = AttemptRunner(hybrid, postprocessors, settings, calibrate(state.background, settings))
        return cls(settings, state, dense, hybrid, postprocessors, attempts)
