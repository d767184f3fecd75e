"""Stage 4: final nodes become evidence blocks; weak ones are not evidence at all."""

from __future__ import annotations

from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.schema import NodeWithScore

from kb_retrieval.models import EvidenceBlock
from kb_retrieval.retrieval.context_pack import render_sections
from kb_retrieval.retrieval.stage import stage_of

dispatcher = get_dispatcher(__name__)


@dispatcher.span
def build_evidence_blocks(
    nodes: list[NodeWithScore], *, evidence_threshold: float, max_blocks: int
) -> list[EvidenceBlock]:
    """Blocks for the nodes whose evidence score reaches ``evidence_threshold``, in rerank order.

    The evidence score is the L1 similarity plus the boosts of L0 hints that this L1 candidate matched: an L1 chunk
    corroborated by an exact alert-name or title match is usable at a lower similarity. The content always comes
    from L1; an L0 match alone never makes a block. A node without a rerank record is judged on its score. A node the
    document expander expanded becomes a document block: its sections in order, matched ones marked.

    A block's layer is ``L0+L1`` when an L0 hint contributed to it, else ``L1``.
    """
    blocks: list[EvidenceBlock] = []
    for node in nodes:
        stage = stage_of(node)
        record = stage.rerank
        evidence_score = record.evidence_score if record is not None else float(node.score or 0.0)
        if evidence_score < evidence_threshold and not stage.exact_terms:  # a rare exact identifier is evidence
            continue
        reasons = record.hit_reasons if record is not None else []
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
        if len(blocks) == max_blocks:
            break
    return blocks
