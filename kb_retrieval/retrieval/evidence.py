"""Stage 4: final nodes become evidence blocks; weak ones are not evidence at all."""

from __future__ import annotations

from llama_index.core.schema import NodeWithScore

from kb_retrieval.models import EvidenceBlock
from kb_retrieval.retrieval.l1.retriever import node_candidate


def build_evidence_blocks(
    nodes: list[NodeWithScore], *, evidence_threshold: float, max_blocks: int
) -> list[EvidenceBlock]:
    """Blocks for the nodes whose evidence score reaches ``evidence_threshold``, in rerank order.

    The evidence score is the L1 similarity plus the boosts of L0 hints that this L1 candidate matched: an L1 chunk
    corroborated by an exact alert-name or title match is usable at a lower similarity. The content always comes
    from L1; an L0 match alone never makes a block.

    A block's layer is ``L0+L1`` when an L0 hint contributed to it (an ``l0_*`` hit reason), else ``L1``.
    """
    blocks: list[EvidenceBlock] = []
    for node in nodes:
        candidate = node_candidate(node)
        if node.node.metadata.get("rerank", {}).get("evidence_score", node.score or 0.0) < evidence_threshold:
            continue
        reasons = list(node.node.metadata.get("rerank", {}).get("hit_reasons", []))
        uses_l0 = any(r.startswith(("l0_", "breadcrumb_match", "content_match")) for r in reasons)
        blocks.append(
            EvidenceBlock(
                source=candidate.source,
                title=candidate.title,
                breadcrumb=candidate.breadcrumb,
                category=candidate.category,
                retrieval_layer="L0+L1" if uses_l0 else "L1",
                content=candidate.content,
                hit_reasons=reasons,
                score=round(float(node.score or 0.0), 6),
                similarity=round(candidate.similarity, 6),
            )
        )
        if len(blocks) == max_blocks:
            break
    return blocks
