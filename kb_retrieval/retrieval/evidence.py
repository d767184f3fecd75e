"""Stage 4: final nodes become evidence blocks; weak ones are not evidence at all."""

from __future__ import annotations

from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.schema import NodeWithScore

from kb_retrieval.models import EvidenceBlock
from kb_retrieval.retrieval.context_pack import render_sections
from kb_retrieval.retrieval.events import span
from kb_retrieval.retrieval.stage import HitKind, HitReason, StageData, stage_of

dispatcher = get_dispatcher(__name__)


@span(dispatcher)
def build_evidence_blocks(
    nodes: list[NodeWithScore], *, evidence_threshold: float, max_blocks: int, follow_ranking: bool = True
) -> list[EvidenceBlock]:
    """Blocks for the nodes that are evidence (evidence score at ``evidence_threshold``, or a rare exact identifier
    of the query in the chunk), in rerank order, led by the nodes ranked above the first of them (``follow_ranking``).

    The evidence score is the L1 similarity plus the boosts of L0 hints that this L1 candidate matched: an L1 chunk
    corroborated by an exact alert-name or title match is usable at a lower similarity. The content always comes
    from L1; an L0 match alone never makes a block. A node without a rerank record is judged on its score. A node the
    document expander expanded becomes a document block: its sections in order, matched ones marked.

    With ``follow_ranking``, once some node is evidence (the lookup answers), the nodes ranked above the first such
    node lead the blocks too, with an ``l1_rank`` hit reason: the threshold decides *whether* the knowledge base
    answers, the ranking *which document comes first*, so the agent receives the ranking's first document (it is
    what the ranking, the trace and the fixtures call rank 1). Whether a lookup finds anything is unchanged: no node
    at the threshold, no block. At least one block is always a node at the threshold.

    A block's layer is ``L0+L1`` when an L0 hint contributed to it, else ``L1``.
    """
    stages = [stage_of(node) for node in nodes]
    passing = [_is_evidence(node, stage, evidence_threshold) for node, stage in zip(nodes, stages, strict=True)]
    if True not in passing:
        return []
    first = passing.index(True)
    lead = min(first, max_blocks - 1) if follow_ranking else 0
    chosen = list(range(lead)) + [i for i in range(first, len(nodes)) if passing[i]]
    blocks: list[EvidenceBlock] = []
    for i in chosen[:max_blocks]:
        node, stage = nodes[i], stages[i]
        record = stage.rerank
        reasons = list(record.hit_reasons) if record is not None else []
        if not passing[i]:
            reasons.append(
                HitReason(
                    kind=HitKind.L1_RANK,
                    detail=f"ranked {i + 1}, above the first evidence at rank {first + 1} "
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


def evidence_score(node: NodeWithScore, stage: StageData) -> float:
    """What ``evidence_threshold`` is compared with: the rerank's evidence score (similarity + L0 boosts)."""
    record = stage.rerank
    return record.evidence_score if record is not None else float(node.score or 0.0)


def _is_evidence(node: NodeWithScore, stage: StageData, evidence_threshold: float) -> bool:
    """At the threshold, or holding a rare exact identifier of the query (that is evidence of its own)."""
    return evidence_score(node, stage) >= evidence_threshold or bool(stage.exact_terms)
