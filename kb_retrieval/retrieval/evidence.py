"""Stage 4: final nodes become evidence blocks; weak ones never make a lookup find, they only follow the ranking."""

from __future__ import annotations

from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.schema import NodeWithScore

from kb_retrieval.models import EvidenceBlock
from kb_retrieval.retrieval.context_pack import render_sections
from kb_retrieval.retrieval.events import span
from kb_retrieval.retrieval.stage import HitKind, HitReason, StageData, stage_of

dispatcher = get_dispatcher(__name__)

#: Where an ``l1_rank`` block that fills the blocks after the first evidence stands (its hit reason says so).
FILL_PLACE = "below"


@span(dispatcher)
def build_evidence_blocks(
    nodes: list[NodeWithScore],
    *,
    evidence_threshold: float,
    max_blocks: int,
    follow_ranking: bool = True,
    fill_by_ranking: bool = True,
) -> list[EvidenceBlock]:
    """Blocks for the nodes that are evidence (evidence score at ``evidence_threshold``, or a rare exact identifier
    of the query in the chunk), in rerank order, led by the nodes ranked above the first of them (``follow_ranking``)
    and followed by every node ranked below it (``fill_by_ranking``).

    The evidence score is the L1 similarity plus the boosts of L0 hints that this L1 candidate matched: an L1 chunk
    corroborated by an exact alert-name or title match is usable at a lower similarity. The content always comes
    from L1; an L0 match alone never makes a block. A node without a rerank record is judged on its score. A node the
    document expander expanded becomes a document block: its sections in order, matched ones marked.

    With ``follow_ranking``, once some node is evidence (the lookup answers), the nodes ranked above the first such
    node lead the blocks too, with an ``l1_rank`` hit reason: the threshold decides *whether* the knowledge base
    answers, the ranking *which document comes first*, so the agent receives the ranking's first document (it is
    what the ranking, the trace and the fixtures call rank 1). Whether a lookup finds anything is unchanged: no node
    at the threshold, no block. At least one block is always a node at the threshold.

    With ``fill_by_ranking``, the nodes ranked below the first evidence follow it in rank order whether they reach
    the threshold or not (an ``l1_rank`` hit reason says which do not: :func:`is_ranking_fill`), up to
    ``max_blocks``: with ``follow_ranking`` too, the blocks are the ranking's first ``max_blocks`` nodes. The right
    document ranked 2nd-5th under the threshold then reaches the context pack, whose budget decides how many the
    agent reads. Without it, only nodes at the threshold follow the first evidence.

    A block's layer is ``L0+L1`` when an L0 hint contributed to it, else ``L1``.
    """
    stages = [stage_of(node) for node in nodes]
    passing = [_is_evidence(node, stage, evidence_threshold) for node, stage in zip(nodes, stages, strict=True)]
    if True not in passing:
        return []
    first = passing.index(True)
    lead = min(first, max_blocks - 1) if follow_ranking else 0
    chosen = list(range(lead)) + [i for i in range(first, len(nodes)) if passing[i] or fill_by_ranking]
    blocks: list[EvidenceBlock] = []
    for i in chosen[:max_blocks]:
        node, stage = nodes[i], stages[i]
        record = stage.rerank
        reasons = list(record.hit_reasons) if record is not None else []
        if not passing[i]:
            where = "above" if i < first else FILL_PLACE
            reasons.append(
                HitReason(
                    kind=HitKind.L1_RANK,
                    detail=f"ranked {i + 1}, {where} the first evidence at rank {first + 1} "
                    f"(evidence score {evidence_score(node, stage):.3f} < {evidence_threshold:.3f})",
                )
            )
        candidate = stage.candidate
        document = stage.document
        blocks.append(
            EvidenceBlock(
                source=candidate.source,
                title=candidate.title,
                breadcrumb=candidate.breadcrumb,
                category=candidate.category,
                retrieval_layer="L0+L1" if any(r.kind.from_l0 for r in reasons) else "L1",
                content=render_sections(document) if document else candidate.content,
                sections=document,
                hit_reasons=[str(r) for r in reasons],
                score=round(float(node.score or 0.0), 6),
                similarity=round(candidate.similarity, 6),
            )
        )
    return blocks


def is_ranking_fill(block: EvidenceBlock) -> bool:
    """Whether ``block`` is one of the ranking's nodes below the first evidence that is not at the threshold itself
    (``fill_by_ranking``): context for the agent, not evidence that the knowledge base answers, so relevance and
    the completeness hint leave it out (they read the blocks at the threshold and those ranked above the first).

    Example:
        >>> block = EvidenceBlock(source="b.md", retrieval_layer="L1", content="", score=0.3, similarity=0.3,
        ...     hit_reasons=["l1_rank:ranked 2, below the first evidence at rank 1 (evidence score 0.300 < 0.420)"])
        >>> is_ranking_fill(block)
        True
    """
    return any(fills_after_evidence(r) for r in block.hit_reasons)


def fills_after_evidence(reason: str) -> bool:
    """Whether the hit reason ``reason`` (``kind:detail``) is the ``l1_rank`` of a node below the first evidence."""
    kind, _, detail = reason.partition(":")
    return kind == HitKind.L1_RANK.value and f", {FILL_PLACE} the first evidence" in detail


def evidence_score(node: NodeWithScore, stage: StageData) -> float:
    """What ``evidence_threshold`` is compared with: the rerank's evidence score (similarity + L0 boosts)."""
    record = stage.rerank
    return record.evidence_score if record is not None else float(node.score or 0.0)


def _is_evidence(node: NodeWithScore, stage: StageData, evidence_threshold: float) -> bool:
    """At the threshold, or holding a rare exact identifier of the query (that is evidence of its own)."""
    return evidence_score(node, stage) >= evidence_threshold or bool(stage.exact_terms)
