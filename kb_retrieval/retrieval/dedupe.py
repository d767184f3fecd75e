"""Stage 3b: keep one node per source, merging the hit reasons of every chunk that found it.

Works on any ``NodeWithScore`` (a stock node's source comes from ``source``, ``ref_doc_id`` or ``file_path``). The
kept node remembers the document's other matched chunks (``StageData.sections``), which the document expander
uses to show the agent every matched section.

Example:
    >>> SourceDeduplicator(focus_weight=0.45).postprocess_nodes(nodes)  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.schema import NodeWithScore, QueryBundle
from pydantic import Field

from kb_retrieval.retrieval.stage import Boost, HitKind, RerankRecord, StageData, rank_key, stage_of, write_stage

_DOC_FOCUS = Boost.DOC_FOCUS.value


class SourceDeduplicator(BaseNodePostprocessor):
    """The best-scoring node of each source survives; the others' hit reasons are merged into it.

    With ``focus_weight`` > 0 the survivor also gains ``focus_weight`` x the share of its document's chunks that
    are among the candidates (the ``doc_focus`` boost): a runbook several of whose sections match the query is about
    it, while a catch-all page of many short sections on other things matches with one or two of them.
    """

    focus_weight: float = Field(default=0.0, ge=0, le=1, description="Weight of the document-focus boost.")
    focus_saturation: float = Field(default=0.5, gt=0, le=1, description="Focus at which the boost is full.")
    focus_padding: int = Field(default=2, ge=0, description="Added to a document's chunk count.")

    @classmethod
    def from_lookup(cls, lookup: Any, config: dict[str, Any] | None = None, **fields: Any) -> SourceDeduplicator:
        """A deduplicator with ``lookup``'s configuration (or ``config``, a ``to_dict()``); it has no runtime state.
        ``fields``: other fields (e.g. ``callback_manager``). The one way the pipeline builds its deduplicator."""
        if config is not None:
            return cls.from_dict(config, **fields)
        s = lookup.settings
        return cls(
            focus_weight=s.doc_focus_weight,
            focus_saturation=s.scoring.focus_saturation,
            focus_padding=s.scoring.focus_padding,
            **fields,
        )

    @classmethod
    def class_name(cls) -> str:
        return "SourceDeduplicator"

    def _postprocess_nodes(
        self, nodes: list[NodeWithScore], query_bundle: QueryBundle | None = None
    ) -> list[NodeWithScore]:
        kept: dict[str, tuple[NodeWithScore, StageData]] = {}
        kinds_of: dict[str, set[HitKind]] = {}  # the kept block's hit-reason kinds, per source, kept up to date
        semantic = HitKind.L1_SEMANTIC
        for node in sorted(nodes, key=rank_key):
            stage = stage_of(node)
            source = stage.candidate.source
            if (first := kept.get(source)) is None:
                stage.merged_chunks = 1
                stage.sections = []
                kept[source] = (node, stage)
                continue
            best = first[1]
            if best.rerank is not None and stage.rerank is not None:
                # Another chunk adds a reason only of a kind the kept block lacks (e.g. the L0 keyword matched in a
                # sibling section); its semantic score or a second content match is not new information.
                if (kinds := kinds_of.get(source)) is None:
                    kinds = kinds_of[source] = best.rerank.kinds()
                for reason in stage.rerank.hit_reasons:
                    if reason.kind not in kinds and reason.kind is not semantic:
                        best.rerank.hit_reasons.append(reason)
                        kinds.add(reason.kind)
            best.merged_chunks += 1
            best.sections.append(stage.candidate)
        weight, saturation, padding = self.focus_weight, self.focus_saturation, self.focus_padding
        for node, stage in kept.values():
            total = stage.candidate.chunk_count or 0
            if weight > 0 and total > 0:
                # Padding: a one- or two-chunk page is not "all about" the query because its one chunk matched.
                # Saturating: among focused documents the focus says nothing more.
                focus = stage.merged_chunks / (total + padding)
                boost = round(weight * min(1.0, focus / saturation), 6)
                if stage.rerank is None:
                    base = stage.candidate.similarity
                    stage.rerank = RerankRecord(base_score=base, evidence_score=float(node.score or base))
                stage.rerank.boosts[_DOC_FOCUS] = boost
                node.score = round((node.score or 0.0) + boost, 6)
            write_stage(node, stage)
        return sorted((n for n, _ in kept.values()), key=rank_key)
