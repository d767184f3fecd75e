"""Pydantic contracts passed between the pipeline stages and returned to callers.

The result's JSON uses the spec's names (``evidenceBlocks``, ``contextPack``, ``retrievalTrace``, ...): every model
here serialises with camelCase aliases (``model_dump(by_alias=True)``) and accepts either spelling on input.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from kb_retrieval.reporting import Displayed, Views


class Contract(BaseModel):
    """Base of every contract: camelCase JSON, snake_case Python."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)

    def to_json_dict(self) -> dict[str, Any]:
        """The model as a JSON-ready dict with the spec's camelCase names."""
        return self.model_dump(mode="json", by_alias=True)


class ScoreLabel(str, Enum):
    """What a raw score means. L2 is a squared distance (lower is better); the others are similarities."""

    COSINE = "cosine_similarity"
    IP = "ip_similarity"
    L2 = "l2_distance"
    EXTERNAL = "external_score"  # a node from another retriever: its score's semantics are that retriever's

    @classmethod
    def for_metric(cls, metric: str) -> ScoreLabel:
        return {"COSINE": cls.COSINE, "IP": cls.IP, "L2": cls.L2}[metric.upper()]


class EvidenceStatus(str, Enum):
    """Whether a lookup found evidence, found none, or could not search the knowledge base."""

    OK = "ok"
    NO_EVIDENCE = "no_evidence"
    #: Milvus could not be searched (every attempt failed): an outage, not an empty knowledge base.
    UNAVAILABLE = "knowledge_base_unavailable"


# --- query transform -------------------------------------------------------------------------------------


class L0Hints(Contract):
    """What L0 keyword/frontmatter matching understood of the query. Hints, never evidence."""

    matched_titles: list[str] = Field(default_factory=list)
    matched_keywords: list[str] = Field(default_factory=list)
    domains: list[str] = Field(default_factory=list)
    entities: list[str] = Field(default_factory=list)
    matched_sources: list[str] = Field(
        default_factory=list, description="Documents L0 matched; used to boost, never returned as evidence."
    )
    title_coverage: dict[str, float] = Field(
        default_factory=dict,
        description="Source -> share of its title's terms (weighted by rarity) the query holds, when at least half.",
    )
    domain_matches: dict[str, list[str]] = Field(
        default_factory=dict,
        description="Domain -> the strong matches that set it: a title, or a keyword that names its documents "
        "(a fragment of other documents' names, a plain word only boost).",
    )
    coverage_domain: str | None = Field(
        default=None,
        description="The domain of the document whose title the query covers best (none on a tie between "
        "domains): a filtered attempt that excludes it is low quality (see RetrievalAttempt.outcome_reason).",
    )

    @property
    def empty(self) -> bool:
        return not (
            self.matched_titles or self.matched_keywords or self.domains or self.entities or self.title_coverage
        )


class QueryTransform(Contract):
    """The query as the lookup searched it: normalised, the L0 hints, the category filter and why."""

    original_query: str
    normalized_query: str
    truncated: bool = False
    notes: list[str] = Field(default_factory=list)
    hints: L0Hints = Field(default_factory=L0Hints)
    category_filter: str | None = None
    filter_reason: str


# --- L1 ------------------------------------------------------------------------------------------------


class Candidate(Contract):
    """One chunk returned by a vector-store path, with explicit score semantics."""

    chunk_id: str
    source: str
    title: str | None = None
    breadcrumb: str | None = None
    category: str | None = None
    content: str
    keywords: list[str] = Field(default_factory=list)
    entities: list[str] = Field(default_factory=list)
    chunk_count: int | None = Field(default=None, description="How many chunks the candidate's document has.")
    position: int | None = Field(default=None, description="The chunk's place in its document (0 = first).")
    score: float = Field(description="The raw value the path returned.")
    score_label: ScoreLabel
    path: Literal["vectorstore", "sdk", "memory", "external"]
    similarity: float = Field(ge=0.0, le=1.0, description="Normalised similarity used by every threshold.")
    doc_hash: str | None = Field(default=None, description="Content hash of the document version of the chunk.")
    ingested_at: float | None = Field(default=None, description="When ingest wrote the chunk (Unix seconds).")


LexicalMode = Literal["milvus_bm25", "in_process_bm25", "off"]
AttemptOutcome = Literal["ok", "no_candidates", "no_evidence", "low_quality", "error", "skipped"]


class RetrievalAttempt(Contract):
    """One L1 search attempt (filtered or not) of a lookup: what it searched, the path that served, and its outcome."""

    attempt: int
    filtered: bool
    category_filter: str | None = None
    filter_expr: str | None = None
    query: str
    path: str | None = Field(default=None, description="The path that served: vectorstore or sdk.")
    path_fallback_reason: str | None = Field(
        default=None, description="Why auto mode left the vectorstore path for the sdk path."
    )
    candidate_count: int = 0
    lexical_mode: LexicalMode = Field(
        default="off",
        description="Where BM25 ran: milvus_bm25 (in Milvus, in the one hybrid_search call), in_process_bm25 (in "
        "memory, its hits scored by a second Milvus search sent beside the dense one), off.",
    )
    lexical_count: int = Field(default=0, description="Chunks BM25 found for this attempt.")
    lexical_added: int = Field(
        default=0, description="Chunks BM25 or an exact identifier added that the dense search had not returned."
    )
    milvus_calls: int = Field(
        default=0,
        description="Requests this attempt sent to Milvus: 0 on the memory plan; else the search, plus in_process_bm25 "
        "a read by key of the BM25 and exact-identifier chunks not kept yet (beside the dense search), plus on the sdk "
        "path a read by key of the rows of dense hits not kept yet (after it).",
    )
    evidence_count: int = 0
    top_similarity: float | None = None
    evidence_threshold: float | None = Field(
        default=None, description="The evidence score this attempt's candidates were judged at (None: not reached)."
    )
    outcome: AttemptOutcome
    outcome_reason: str | None = Field(
        default=None, description="Why a filtered attempt is low quality (its similarity, or L0's title coverage)."
    )
    error: str | None = None
    elapsed_ms: float = 0.0


FallbackReason = Literal["filtered_vector_no_evidence", "filtered_vector_low_quality"]


class RetrievalTrace(Contract):
    """How a lookup searched: its attempts, the one selected, why it fell back, and the counts."""

    attempts: list[RetrievalAttempt] = Field(default_factory=list)
    selected_attempt: int | None = None
    fallback_reason: FallbackReason | None = None
    path_served: str | None = None
    candidate_count: int = 0
    final_count: int = 0
    calibration: dict[str, Any] | None = Field(
        default=None,
        description="The found and relevance thresholds used on this knowledge base, their source and why.",
    )


# --- post-processing --------------------------------------------------------------------------------------


class RerankEntry(Contract):
    """One ranked candidate in the rerank trace: its rank, base score, boosts and final score."""

    rank: int
    source: str
    breadcrumb: str | None = None
    base_score: float
    boosts: dict[str, float] = Field(default_factory=dict)
    ranking: dict[str, float] = Field(
        default_factory=dict,
        description="When documents were ranked as wholes: each weighted signal; they sum to final_score.",
    )
    final_score: float


class RerankTrace(Displayed, Contract):
    """How the rerank ranked the documents; in a notebook a table (``to_dataframe()``: one row per document)."""

    views: ClassVar[Views] = Views("rerank_view", "rerank_repr", "rerank_rows", "rerank_columns")

    candidate_count: int = 0
    entries: list[RerankEntry] = Field(default_factory=list)


class DocumentSection(Contract):
    """One section (chunk) of an evidence document, in document order; ``matched`` when retrieval found it."""

    breadcrumb: str | None = None
    content: str
    position: int
    matched: bool = False
    match_rank: int | None = Field(
        default=None, description="For a matched section, its place in retrieval's order (0: the document's best)."
    )
    hit_reasons: list[str] = Field(default_factory=list)


class EvidenceBlock(Displayed, Contract):
    """One evidence document; in a notebook its reasons and sections (``to_dataframe()``: one row per section)."""

    views: ClassVar[Views] = Views("evidence_view", "evidence_repr", "evidence_rows", "EVIDENCE_FRAME_COLUMNS")

    source: str
    title: str | None = None
    breadcrumb: str | None = None
    category: str | None = None
    retrieval_layer: Literal["L1", "L0+L1"]
    content: str
    hit_reasons: list[str] = Field(default_factory=list)
    score: float = Field(description="Final rerank score.")
    similarity: float = Field(description="Normalised semantic similarity of the block's best chunk.")
    sections: list[DocumentSection] = Field(
        default_factory=list,
        description="The document's sections in order, matched ones marked (empty: the block is its best chunk).",
    )


class PackedBlock(Contract):
    """One evidence block as the context pack holds it, cut to the budget when it had to be."""

    source: str
    title: str | None = None
    breadcrumb: str | None = None
    hit_reasons: list[str] = Field(default_factory=list)
    content: str
    truncated: bool = False


class ContextPackSummary(Contract):
    """What the context pack holds: the token budget and use, and the sources included, cut or left out."""

    budget_tokens: int
    used_tokens: int
    included_sources: list[str] = Field(default_factory=list)
    truncated_sources: list[str] = Field(default_factory=list)
    omitted_sources: list[str] = Field(default_factory=list)
    sections_left_out: dict[str, int] = Field(
        default_factory=dict, description="Per source, how many of its unmatched sections the budget left out."
    )
    matched_left_out: dict[str, int] = Field(
        default_factory=dict, description="Per source, how many of its matched sections the budget left out."
    )


class ContextPack(Contract):
    """The evidence packed for the agent within the token budget: its blocks, its text and a summary."""

    blocks: list[PackedBlock] = Field(default_factory=list)
    text: str = ""
    summary: ContextPackSummary


RelevanceLevel = Literal["high", "medium", "low", "none"]


class NearMiss(Contract):
    """A candidate document below the evidence threshold, named when a lookup finds no evidence."""

    source: str
    title: str | None = None
    similarity: float = Field(description="Normalised semantic similarity of the document's best chunk.")
    evidence_score: float = Field(description="What the threshold was compared with: similarity + L0 boosts.")
    threshold: float = Field(description="The evidence threshold of the attempt that ranked it.")


class LookupResult(Displayed, Contract):
    """The evidence-first result of one ``lookup_knowledge`` call.

    In a notebook it shows as the evidence table (rank, source, title, relevance, in pack, why) with the traces
    folded; ``to_dataframe()`` gives that table, one row per evidence document.
    """

    views: ClassVar[Views] = Views("result_view", "result_repr", "result_rows", "RESULT_FRAME_COLUMNS")

    found: bool
    evidence_status: EvidenceStatus
    message: str
    evidence_blocks: list[EvidenceBlock] = Field(default_factory=list)
    context_pack: ContextPack
    query_transform: QueryTransform
    retrieval_trace: RetrievalTrace
    rerank_trace: RerankTrace
    relevance_level: RelevanceLevel
    completeness_hint: str
    confidence: str = Field(
        default="",
        description="How clearly the first document leads, in words: 'clear lead: ...' or 'close call: ...' naming "
        "the runner-up ('' without evidence).",
    )
    retrieval_layer: Literal["L1", "L0+L1", "none"]
    near_misses: list[NearMiss] = Field(
        default_factory=list,
        description="Without evidence: the best candidate documents below the evidence threshold, best first (at "
        "most 3), each with its similarity, evidence score and the threshold it missed.",
    )
    elapsed_ms: float = 0.0
    stage_ms: dict[str, float] = Field(default_factory=dict)
    trace_recorded: bool = Field(
        default=True,
        description="The trace row was accepted: queued for the background writers (a row that then fails is logged "
        "and counted by the trace store), or, with trace_wait, committed.",
    )
