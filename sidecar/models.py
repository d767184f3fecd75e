"""The sidecar's contracts: one comparable result shape for both paths, and the outcome of one sidecar run.

A :class:`ComparableResult` is one *document* in a path's ranking (one per source), in the same terms as the main
path's candidates: source, title, breadcrumb, category, rank, a content preview, and the raw score with the label
naming its semantics. ``path`` names which path produced it (``main:sdk``, ``main:vectorstore`` or
``sidecar:vectorstore``), so scores are never read as if the two paths' numbers meant the same thing.

Example:
    >>> run = SidecarRun(status="timeout", reason="no answer within 0.5 s (retrieving)", elapsed_ms=500.0)
    >>> run.trace_entry()["status"]
    'timeout'
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from kb_retrieval.evaluation.hit_levels import HIT_RANK_CUTOFF
from kb_retrieval.sidecar_protocol import DISABLED_REASON

#: ``disabled``: not enabled (``KB_SIDECAR_ENABLED``); ``ok``: answered in time; ``unavailable``: could not be
#: initialised (or started); ``failed``: raised while retrieving; ``timeout``: no answer within ``sidecar_timeout_s``.
SidecarStatus = Literal["disabled", "ok", "unavailable", "failed", "timeout"]
SIDECAR_STATUSES: tuple[SidecarStatus, ...] = ("disabled", "ok", "unavailable", "failed", "timeout")

#: The sidecar's path name: the stock LlamaIndex ``VectorIndexRetriever`` over ``MilvusVectorStore``.
SIDECAR_PATH = "sidecar:vectorstore"
#: How many characters of content a comparable result keeps.
PREVIEW_CHARS = 160
#: How many of the sidecar's candidates the trace row keeps.
TRACE_CANDIDATES = 5
#: Documents compared per path by default (``kb-retrieval compare --k``): the evaluator's hit cut-off, so ``compare``
#: and ``eval`` call the same case by the same level.
DEFAULT_K = HIT_RANK_CUTOFF


class ComparableResult(BaseModel):
    """One document of a path's ranking, in the shape both paths share (best chunk of the source)."""

    model_config = ConfigDict(frozen=True)

    path: str
    """Which path ranked it: ``main:<sdk|vectorstore>`` or ``sidecar:vectorstore``."""
    rank: int = Field(ge=1)
    """1-based rank among this path's documents (after dedupe by source)."""
    source: str
    """Document id: path relative to the knowledge-base root."""
    chunk_id: str | None = None
    """Primary key of the best chunk, when the path exposes it (the stock retriever does not)."""
    title: str | None = None
    breadcrumb: str | None = None
    category: str | None = None
    content_preview: str = ""
    score_label: str
    """Semantics of ``score``: ``cosine_similarity``, ``ip_similarity`` or ``l2_distance`` (lower is better)."""
    score: float
    """The raw Milvus score of the best chunk, in the semantics of ``score_label``; comparable only within a path."""
    in_evidence: bool | None = None
    """Whether the agent received this document (in the lookup's context pack). Set for the main path only: the
    sidecar's results never reach the agent."""
    content: str = Field(default="", exclude=True, repr=False)
    """The best chunk's full text: for keyword checks (hit levels); never serialised (reports keep the preview)."""


class SidecarRun(BaseModel):
    """The outcome of one sidecar retrieval beside one lookup. Never part of the lookup's result.

    A :class:`kb_retrieval.sidecar_protocol.SidecarRunProtocol`: the core records :meth:`trace_entry` in the trace row.
    """

    model_config = ConfigDict(frozen=True)

    status: SidecarStatus
    reason: str | None = None
    """Why the status is not ``ok``: the error, the timeout, or why it is disabled or unavailable."""
    path: str = SIDECAR_PATH
    score_label: str | None = None
    """Semantics of every ``score`` in ``results`` (the collection's metric)."""
    elapsed_ms: float = 0.0
    """From the sidecar's start until it answered (or until it was given up on)."""
    waited_ms: float = 0.0
    """How long the end of the lookup waited for it (0 when it had already finished)."""
    chunk_count: int = 0
    """Chunks the retriever returned, before dedupe by source."""
    results: list[ComparableResult] = Field(default_factory=list)
    """Its ranking, one document per source, best first (empty unless ``ok``)."""

    def trace_entry(self, top: int = TRACE_CANDIDATES) -> dict[str, Any]:
        """The compact ``retrieval_details.sidecar`` entry of the trace row (no content)."""
        return {
            "status": self.status,
            "reason": self.reason,
            "path": self.path,
            "score_label": self.score_label,
            "elapsed_ms": self.elapsed_ms,
            "waited_ms": self.waited_ms,
            "chunk_count": self.chunk_count,
            "top_candidates": [
                {"rank": r.rank, "source": r.source, "score_label": r.score_label, "score": r.score}
                for r in self.results[:top]
            ],
        }


def disabled_run(reason: str = DISABLED_REASON) -> SidecarRun:
    """The run of a lookup whose sidecar is off."""
    return SidecarRun(status="disabled", reason=reason)
