"""Stage 3b: keep one block per source identity, merging the hit reasons of every path that found it."""

from __future__ import annotations

from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.schema import NodeWithScore, QueryBundle

from kb_retrieval.retrieval.l1.retriever import node_candidate

FOCUS_SATURATION = 0.5


class SourceDeduplicator(BaseNodePostprocessor):
    """The best-scoring node of each source survives; the others' hit reasons are merged into it.

    With ``focus_weight`` > 0 the survivor also gains ``focus_weight`` x the share of its document's chunks that
    are among the candidates (the ``doc_focus`` boost): a runbook several of whose sections match the query is about
    it, while a catch-all page of many short sections on other things matches with one or two of them.
    """

    focus_weight: float = 0.0

    @classmethod
    def class_name(cls) -> str:
        return "SourceDeduplicator"

    def _postprocess_nodes(
        self, nodes: list[NodeWithScore], query_bundle: QueryBundle | None = None
    ) -> list[NodeWithScore]:
        kept: dict[str, NodeWithScore] = {}
        for node in sorted(nodes, key=lambda n: (-(n.score or 0.0), n.node.node_id)):
            source = node_candidate(node).source
            reasons = list(node.node.metadata.get("rerank", {}).get("hit_reasons", []))
            if source not in kept:
                kept[source] = node
                node.node.metadata.setdefault("rerank", {})["hit_reasons"] = reasons
                node.node.metadata["merged_chunks"] = 1
                continue
            best = kept[source]
            merged = best.node.metadata["rerank"]["hit_reasons"]
            # Another chunk adds a reason only of a kind the kept block lacks (e.g. the L0 keyword matched in a
            # sibling section); its semantic score or a second content match is not new information.
            kinds = {r.split(":", 1)[0] for r in merged}
            for reason in reasons:
                kind = reason.split(":", 1)[0]
                if kind not in kinds and kind != "l1_semantic":
                    merged.append(reason)
                    kinds.add(kind)
            best.node.metadata["merged_chunks"] += 1
        if self.focus_weight > 0:
            for node in kept.values():
                total = node_candidate(node).chunk_count or 0
                if total > 0:
                    # +2: a one- or two-chunk page is not "all about" the query because its one chunk matched.
                    # Saturating at FOCUS_SATURATION: among focused documents the focus says nothing more.
                    focus = node.node.metadata["merged_chunks"] / (total + 2)
                    boost = round(self.focus_weight * min(1.0, focus / FOCUS_SATURATION), 6)
                    node.node.metadata["rerank"].setdefault("boosts", {})["doc_focus"] = boost
                    node.score = round((node.score or 0.0) + boost, 6)
        return sorted(kept.values(), key=lambda n: (-(n.score or 0.0), n.node.node_id))
