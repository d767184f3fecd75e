"""The settings groups of a lookup: retrieval (path, plan, candidates, BM25, ranking, deadlines, the query's
reading), evidence (thresholds and the context budget), the trace store and the comparison sidecar.

Example:
    >>> RetrievalSettings(vector_store_mode="spring-ai").vector_store_mode
    'vectorstore'
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from kb_retrieval.masking import checked_url

__all__ = ["EvidenceSettings", "LookupPlan", "RetrievalSettings", "SidecarSettings", "TraceSettings", "VectorStoreMode"]

VectorStoreMode = Literal["auto", "vectorstore", "sdk"]
LookupPlan = Literal["auto", "memory", "milvus"]


class RetrievalSettings(BaseModel):
    """How a lookup searches: the path and plan, candidates, BM25, document ranking, deadlines and the query's
    reading (``KB_RETRIEVAL__<NAME>``)."""

    model_config = ConfigDict(validate_assignment=True)

    vector_store_mode: VectorStoreMode = Field(
        default="auto", description="'vectorstore' (LlamaIndex MilvusVectorStore), 'sdk' (pymilvus), 'auto'."
    )
    lookup_plan: LookupPlan = Field(
        default="auto",
        description="Where a lookup searches: 'memory' (a mirror of the collection in this process, read from "
        "Milvus at start and again when the index version changes; no Milvus call per lookup), 'milvus' (one "
        "search call per attempt), or 'auto': memory on Milvus Lite when vector_store_mode is 'auto' and the "
        "collection fits memory_plan_max_mb, else milvus.",
    )
    memory_plan_max_mb: float = Field(
        default=2048.0,
        gt=0,
        description="The memory plan's bound: a collection whose mirror would pass it is searched in Milvus "
        "(about 0.5 GB per 100k chunks of ~1 KB text with 384-d vectors, by estimate). On the milvus plan it also "
        "bounds the chunks kept once read by key (their rows; with BM25 in process, the vectors of its hits too).",
    )
    top_k: int = Field(default=20, gt=0, le=200, description="L1 candidates fetched per attempt.")
    lexical_enabled: bool = Field(
        default=True,
        description="BM25 over the collection's chunks beside the dense search: in Milvus (one hybrid_search call) "
        "where the engine and collection have full-text search, else in process (lexical_mode in stats and traces).",
    )
    lexical_top_k: int = Field(default=20, ge=0, le=200, description="Lexical candidates added per attempt.")
    document_ranking: bool = Field(
        default=True,
        description="Rank documents by their title, summary and whole-text vectors with the chunk signals "
        "(the scoring profile's rank_*); off, or without document vectors, the rule reranker's score ranks them.",
    )
    content_interleave: bool = Field(
        default=True,
        description="From the document ranking's fourth place on, alternate its order with the documents' whole-"
        "content similarity (the mean of their chunk vectors): the ranking's first three documents lead, and the "
        "evidence and the context pack also hold the documents whose content is nearest the question, whatever "
        "signal the ranking's weights let decide (hit reason l1_document: placed by content). The first document "
        "and found are unchanged; false: the ranking's order throughout.",
    )
    expand_documents: bool = Field(
        default=True,
        description="Small-to-big: an evidence block is its whole document (sections in order, matched ones "
        "marked); the context pack gives every document's best matched section, then the top document's other "
        "sections, then the others' further matched sections, as the budget allows.",
    )
    retriever_workers: int = Field(
        default=2,
        ge=1,
        le=64,
        description="Threads that run lookups for async callers (aretrieve, aquery). A lookup is mostly CPU work "
        "under the GIL (embedding, rerank): more threads than cores only make the event loop wait longer for it.",
    )
    lookup_timeout_s: float = Field(
        default=20.0,
        gt=0,
        description="One deadline for a whole lookup: every Milvus call gets what is left of it (at most "
        "milvus_search_timeout_s), and an attempt that would start after it is skipped.",
    )
    freshness_check_s: float = Field(
        default=2.0,
        ge=0,
        description="A lookup object checks the index version (one small Milvus query) at most this often and "
        "reloads the L0 index and in-process BM25 when another process has ingested; 0 checks on every lookup.",
    )
    read_short_names: bool = Field(
        default=True,
        description="kubectl's short resource names in a query are read as the kinds they name, the kind written "
        "before the short name (sts/kafka -> StatefulSet sts/kafka, ns analytics -> namespace ns analytics; "
        "kb_retrieval.retrieval.short_names) for every layer, noted in the query transform. false: the query is "
        "searched as written.",
    )
    drop_template_placeholders: bool = Field(
        default=True,
        description="The query encoder reads an alert text without its template placeholders ({{ $labels.pod }}, "
        "$value: syntax, not words; kb_retrieval.retrieval.templates), noted in the query transform; BM25 and L0 read "
        "the query as it was. false: the encoder reads them too.",
    )
    max_query_chars: int = Field(default=4000, ge=16, description="Longer queries are truncated (noted).")
    l1_enabled: bool = Field(
        default=True,
        description="Semantic retrieval; off only for diagnostics: the spec's 'unless L1 is explicitly disabled by "
        "configuration' (L0 then gives hints, never evidence, and the result says so).",
    )

    @field_validator("vector_store_mode", mode="before")
    @classmethod
    def _alias_spring_ai(cls, value: object) -> object:
        # The spec's Java name for the VectorStore path; accepted as an alias because it costs nothing.
        return "vectorstore" if value == "spring-ai" else value


class EvidenceSettings(BaseModel):
    """What counts as evidence and how much of it the context pack holds (``KB_EVIDENCE__<NAME>``)."""

    model_config = ConfigDict(validate_assignment=True)

    max_evidence_blocks: int = Field(
        default=7,
        gt=0,
        description="Evidence blocks returned at most: the documents the context pack may hold, so that the budget, "
        "not this count, decides how many the agent reads (at 5 the pack used a median 1,357 of its 2,000 tokens "
        "and left out documents it had room for; at 7, 1,840; at 10 no more right documents reached it on the "
        "public sets and the first document's context was cut more often: docs/tuning-history.md, session 36).",
    )
    reference_threshold: float = Field(
        default=0.45,
        ge=0,
        le=1,
        description="A filtered attempt whose top normalised similarity is below this is retried unfiltered.",
    )
    evidence_threshold: float = Field(
        default=0.42,
        ge=0,
        le=1,
        description="A candidate whose final score (normalised similarity + L0 boosts) is below this is not usable "
        "evidence.",
    )
    calibrate_thresholds: bool = Field(
        default=True,
        description="found and relevance calibrated per knowledge base (kb_retrieval.retrieval.calibration): the "
        "evidence threshold and relevance_high are raised to what questions in the KB's own vocabulary reach in a "
        "document that does not answer them (measured once per index version on the memory plan); off, or too "
        "small a KB: the constants.",
    )
    evidence_follows_ranking: bool = Field(
        default=True,
        description="Once a lookup has evidence, the documents ranked above the first one at evidence_threshold lead "
        "the evidence blocks (hit reason l1_rank): the threshold decides whether the knowledge base answers, the "
        "ranking which document comes first; false: only documents at the threshold are blocks (kept beside "
        "evidence_fills_by_ranking: false still changes which document leads on the public paraphrase set, and a "
        "request may compare the two).",
    )
    evidence_fills_by_ranking: bool = Field(
        default=True,
        description="Once a lookup has evidence, the documents ranked below the first one at evidence_threshold "
        "follow it in rank order up to max_evidence_blocks, at the threshold or not (hit reason l1_rank): the "
        "context budget then decides how many the agent reads; relevance and completenessHint still count only "
        "the documents at the threshold and those ranked above them; false: only documents at the threshold follow.",
    )
    context_budget_tokens: int = Field(
        default=2000,
        ge=64,
        description="Token budget of the context pack: room for the best section of each evidence document beside the "
        "first one's context (the right document in the pack: 0.944 of a docs set's questions, 0.917 at 1200).",
    )


class TraceSettings(BaseModel):
    """The trace store: where each lookup's row goes and what it keeps (``KB_TRACE__<NAME>``; short forms
    ``KB_TRACE_<NAME>``)."""

    model_config = ConfigDict(validate_assignment=True)

    db_url: str | None = Field(
        default=None,
        description="SQLAlchemy URL of the trace store. Default: sqlite:///<state_dir>/traces.db (created readable "
        "by its owner only). A password in it is masked wherever the URL is shown.",
    )
    timeout_s: float = Field(
        default=2.0,
        gt=0,
        description="The database's busy, lock and statement timeouts for a trace row, and the longest anything waits "
        "on the trace store: a lookup for room in a full queue (then its row is given up: trace_recorded = false), "
        "for its commit with trace_wait, closing the store for its queued rows (the rest given up, logged, counted).",
    )
    wait: bool = Field(
        default=False,
        description="false: a lookup queues its trace row and returns (trace_recorded = true: accepted; a row that "
        "then fails is logged and counted, never dropped silently). true: a lookup waits for the commit (at most "
        "trace_timeout_s) and trace_recorded says whether the row was committed.",
    )
    query: Literal["full", "hash", "redact"] = Field(
        default="full",
        description="How trace rows keep the query text: 'full'; 'hash' (sha256 of the query, so identical queries "
        "can still be grouped); 'redact' (only its length). Alert texts can carry host names and credentials.",
    )
    content_chars: int = Field(default=160, ge=0, description="Content preview kept in trace rows.")

    @field_validator("db_url")
    @classmethod
    def _url_parses(cls, value: str | None) -> str | None:
        return checked_url(value, host_required=False)


class SidecarSettings(BaseModel):
    """The stock LlamaIndex retriever run beside a lookup, for comparison only (``KB_SIDECAR__<NAME>``; short forms
    ``KB_SIDECAR_<NAME>``)."""

    model_config = ConfigDict(validate_assignment=True)

    enabled: bool = Field(default=False, description="Run the sidecar (stock LlamaIndex retriever) per lookup.")
    timeout_s: float = Field(
        default=5.0, gt=0, description="How long a lookup waits for the sidecar at its end (then: status timeout)."
    )
    factory: str = Field(
        default="sidecar.runner:SidecarRunner",
        description="'module:Factory' creating the comparison runner when the sidecar is enabled (called with the "
        "settings and the embedding model); the core imports it only then.",
    )
