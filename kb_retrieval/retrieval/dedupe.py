"""Stage 3b: keep one block per source identity, merging the hit reasons of every path that found it."""

from __future__ import annotations

from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.schema import NodeWithScore, QueryBundle

from kb_retrieval.retrieval.l1.retriever import node_candidate


class SourceDeduplicator(BaseNodePostprocessor):
    """The best-scoring node of each source survives; the others' hit reasons are merged into it."""

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
            # Semantic scores of other chunks are not new reasons; named hints from them are.
            merged.extend(r for r in reasons if r not in merged and not r.startswith("l1_semantic:"))
            best.node.metadata["merged_chunks"] += 1
        return list(kept.values())
