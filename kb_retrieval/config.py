"""One settings object for the whole library (environment prefix ``KB_``), its groups in :mod:`kb_retrieval.settings`.

Every path, URI, mode, threshold and budget is named and documented once. CLI flags override the environment; the
environment overrides the defaults.

Example:
    >>> settings = KBSettings(state_dir="/tmp/kb", vector_store_mode="sdk")
    >>> settings.resolved_milvus_uri().endswith("milvus.db")
    True
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Self, cast

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

# Masking lives in its own module, the groups in kb_retrieval.settings; these names stay importable from here.
from kb_retrieval.masking import MASK, SECRET_PARAMETERS, mask_secrets, mask_url, url_secrets
from kb_retrieval.settings import (
    FLAT,
    GROUPS,
    ChunkingSettings,
    EmbeddingSettings,
    EvidenceSettings,
    FlatNamesSource,
    RetrievalSettings,
    SchemaFieldsSettings,
    SidecarSettings,
    StorageSettings,
    TraceSettings,
    flattened,
    grouped,
)

__all__ = [
    "MASK",
    "SECRET_PARAMETERS",
    "KBSettings",
    "ScoringSettings",
    "mask_secrets",
    "mask_url",
    "url_secrets",
]


class ScoringSettings(BaseModel):
    """Every weight and cut-off of the rule reranker, dedupe and result assembly, each with its reason.

    Set one from the environment as ``KB_SCORING__<NAME>`` (e.g. ``KB_SCORING__BOOST_L0_TITLE=0.2``).
    """

    model_config = ConfigDict(validate_assignment=True)

    boost_l0_title: float = Field(default=0.15, ge=0, le=1, description="The document's title was matched by L0.")
    boost_l0_keyword: float = Field(
        default=0.15, ge=0, le=1, description="A frontmatter keyword of the document (e.g. an alert name) matched."
    )
    boost_l0_entity: float = Field(default=0.05, ge=0, le=1, description="An entity of the document matched.")
    boost_l0_category: float = Field(
        default=0.03,
        ge=0,
        le=1,
        description="The document's category is an L0 domain: weak, domains are wide.",
    )
    boost_breadcrumb: float = Field(
        default=0.04, ge=0, le=1, description="A matched keyword or entity occurs in the chunk's breadcrumb."
    )
    boost_content: float = Field(
        default=0.04, ge=0, le=1, description="A matched keyword or entity occurs in the chunk's text."
    )
    boost_title_terms: float = Field(
        default=0.2,
        ge=0,
        le=1,
        description="Times the L0 title coverage (0.5-1): the query holds much of the title, term by term "
        "(0.15/0.2/0.3 tried on the public sets; 0.2 best).",
    )
    boost_exact_match: float = Field(
        default=0.6,
        ge=0,
        le=1,
        description="Divided by the documents holding it: a chunk holds a rare identifier of the query verbatim (and "
        "is evidence whatever its similarity). The one literal holder outranks a document-focus boost (0.45).",
    )
    exact_match_max_df: int = Field(
        default=2,
        ge=0,
        description="An identifier is rare enough to be evidence when at most this many documents hold it "
        "(2: measured on the public sets to fire rarely and rightly; 0 turns the signal off).",
    )
    rare_term_max_df: int = Field(
        default=1,
        ge=0,
        description="A plain word or UpperCamel name of the query is a rare term (evidence, like an identifier) when "
        "at most this many documents hold it and such a document names it in its title or a heading (1: see "
        "retrieval/exact.py for the measurement; 0 turns the signal off).",
    )
    focus_saturation: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description="Document focus (matched chunks / (chunks + 2)) at which the focus boost is full: among "
        "focused documents more focus says nothing more.",
    )
    focus_padding: int = Field(
        default=2, ge=0, description="Added to a document's chunk count: a one-chunk page is not all about a query."
    )
    close_call_margin: float = Field(
        default=0.1,
        ge=0,
        description="The first document leads clearly when its final score is at least this far above the second's; "
        "below, the result's confidence says 'close call' and names both (on the public runbook sets the first "
        "document was right in 96% of lookups at a lead of 0.1 or more, in 62% below it; 11 of the 19 lookups whose "
        "right runbook came second were below).",
    )
    relevance_high: float = Field(default=0.6, ge=0, le=1, description="Top similarity from which relevance is high.")
    relevance_medium: float = Field(
        default=0.45, ge=0, le=1, description="Top similarity from which relevance is medium (below: low)."
    )
    min_content_tokens: int = Field(
        default=12, ge=1, description="A packed block needs room for at least this much content, else it is omitted."
    )
    l0_max_keyword_documents: int = Field(
        default=3, ge=1, description="A keyword shared by more documents than this is too generic to be a hint."
    )
    l0_title_coverage_min: float = Field(
        default=0.5, ge=0, le=1, description="Title coverage below this is not a hint (half the title at least)."
    )
    l0_title_coverage_limit: int = Field(default=20, ge=1, description="Title-coverage hints kept per query.")

    # --- document ranking (DocumentRanker): one linear model over the signals of a document ------------------
    # Fitted on the public golden sets (every runbooks set, both settings: a listwise softmax loss over each
    # query's candidate documents, then rounded); 4-fold cross-validation by query gave the alert sets within 0.02
    # of the fitted figures and paraphrase hit@1 0.63 / 0.67 (runbooks / mixed) against 0.54 / 0.53 before
    # document ranking (0.58 / 0.67 without the static model's signal).
    rank_title: float = Field(
        default=0.75, ge=0, le=5, description="Times the query's similarity to the document's title vector."
    )
    rank_summary: float = Field(
        default=0.75, ge=0, le=5, description="Times the similarity to the title + opening section vector."
    )
    rank_text: float = Field(
        default=1.5, ge=0, le=5, description="Times the similarity to the text vector (its chunks' mean)."
    )
    rank_static_summary: float = Field(
        default=0.5,
        ge=0,
        le=5,
        description="Times the static model's similarity of the query to the title + opening section "
        "(kb_retrieval.indexing.static_embed).",
    )
    rank_static_title: float = Field(
        default=0.75,
        ge=0,
        le=5,
        description="Times the static model's similarity of the query to the document's title, words weighted by "
        "their rarity in the knowledge base (the title vector's weight, not fitted: on the public sets 0.5-1.0 "
        "gave the same figures within a query or two per set).",
    )
    static_common_min_documents: int = Field(
        default=20,
        ge=0,
        description="From this many documents the static model's signals leave out the direction every document's "
        "static vector shares (its first singular vector, kb_retrieval.indexing.doc_vectors.common_direction); 0: "
        "never. Fewer documents do not estimate it.",
    )
    rank_chunk: float = Field(
        default=0.0,
        ge=0,
        le=5,
        description="Times the best chunk's similarity: fitted -0.25 once the document vectors are there, so 0 (it "
        "still decides which section is the evidence, and whether any is).",
    )
    rank_lexical: float = Field(default=0.3, ge=0, le=5, description="Times the rule reranker's lexical boost.")
    rank_title_terms: float = Field(default=2.2, ge=0, le=5, description="Times the title-terms boost.")
    rank_l0: float = Field(
        default=1.7,
        ge=0,
        le=5,
        description="Times the L0 boosts (title, keyword, entity, category, breadcrumb, content).",
    )
    rank_doc_focus: float = Field(
        default=0.05,
        ge=0,
        le=5,
        description="Times the document-focus boost (fitted 0.05: the document vectors say what focus said).",
    )
    rank_exact_match: float = Field(
        default=1.0, ge=0, le=5, description="Times the exact-identifier boost (too rare in the sets to fit: kept)."
    )
    fit_ranking: bool = Field(
        default=True,
        description="Let each knowledge base choose, when an index version is first opened, the best section's "
        "weight (rank_chunk), its BM25's weight (rank_lexical) and a factor on the identity weights (rank_title, "
        "rank_summary, rank_static_*) on questions made from its own sections (kb_retrieval.retrieval.rank_fit); "
        "off, or with too few sections, the rank_* weights as set.",
    )
    fit_queries: int = Field(
        default=200, ge=0, le=2000, description="Pseudo-queries the ranking fit asks at most (0: no fit)."
    )
    fit_min_queries: int = Field(
        default=50, ge=1, le=2000, description="Fewer pseudo-queries than this: the rank_* weights as set."
    )

    @property
    def exact_signals(self) -> bool:
        """Whether a lookup needs the exact-identifier index (identifiers or rare terms on)."""
        return self.exact_match_max_df > 0 or self.rare_term_max_df > 0

    def ranking_weights(self) -> dict[str, float]:
        """The document ranker's weights by the names its trace records."""
        return {
            "doc_title": self.rank_title,
            "doc_summary": self.rank_summary,
            "doc_text": self.rank_text,
            "doc_static": self.rank_static_summary,
            "doc_static_title": self.rank_static_title,
            "chunk": self.rank_chunk,
            "lexical": self.rank_lexical,
            "title_terms": self.rank_title_terms,
            "l0": self.rank_l0,
            "doc_focus": self.rank_doc_focus,
            "exact_match": self.rank_exact_match,
        }

    def boosts(self) -> dict[str, float]:
        """The rerank boosts by the names the rerank trace records."""
        return {
            "l0_title": self.boost_l0_title,
            "l0_keyword": self.boost_l0_keyword,
            "l0_entity": self.boost_l0_entity,
            "l0_category": self.boost_l0_category,
            "breadcrumb": self.boost_breadcrumb,
            "content": self.boost_content,
            "title_terms": self.boost_title_terms,
            "exact_match": self.boost_exact_match,
        }


class KBSettings(BaseSettings):
    """Configuration of ingest and lookup (named apart from ``llama_index.core.Settings``; ``Settings`` is an alias).

    Grouped (``settings.retrieval.top_k``, ``KB_RETRIEVAL__TOP_K``); flat short forms in (``top_k=``, ``KB_TOP_K``)."""

    model_config = SettingsConfigDict(
        env_prefix="KB_", extra="ignore", validate_assignment=True, hide_input_in_errors=True, env_nested_delimiter="__"
    )

    storage: StorageSettings = Field(default_factory=StorageSettings)
    schema_fields: SchemaFieldsSettings = Field(default_factory=SchemaFieldsSettings)
    chunking: ChunkingSettings = Field(default_factory=ChunkingSettings)
    embedding: EmbeddingSettings = Field(default_factory=EmbeddingSettings)
    retrieval: RetrievalSettings = Field(default_factory=RetrievalSettings)
    evidence: EvidenceSettings = Field(default_factory=EvidenceSettings)
    trace: TraceSettings = Field(default_factory=TraceSettings)
    sidecar: SidecarSettings = Field(default_factory=SidecarSettings)

    lexical_weight: float = Field(
        default=0.2, ge=0, le=1, description="Rerank boost of the best lexical hit; others in proportion."
    )
    lexical_rescore_min: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description="Lexical hits the dense search missed join the candidates only from this BM25 score (relative "
        "to the best hit) up; 0 takes them all. In process they cost a second Milvus search; in Milvus they come "
        "with the one hybrid call.",
    )
    doc_focus_weight: float = Field(
        default=0.45, ge=0, le=1, description="Boost by the share of a document's chunks among the candidates."
    )
    scoring: ScoringSettings = Field(default_factory=ScoringSettings)

    def __init__(self, **values: Any) -> None:  # typed so: the flat names are keywords too, KBSettings(top_k=50)
        super().__init__(**values)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Each source's flat names join their groups before the sources are merged: a keyword then still wins over
        # the environment whichever form either uses.
        flat_names = tuple(FlatNamesSource(source) for source in (init_settings, env_settings, dotenv_settings))
        return (*flat_names, file_secret_settings)

    @model_validator(mode="before")
    @classmethod
    def _flat_names(cls, data: Any) -> Any:
        return grouped(data) if isinstance(data, Mapping) else data  # model_validate({"top_k": 50})

    @classmethod
    def setting_names(cls) -> list[str]:
        """Every setting's flat name: a group's settings by their short form, then the ungrouped ones (``scoring``)."""
        return [*FLAT, *(name for name in cls.model_fields if name not in GROUPS)]

    @classmethod
    def setting_field(cls, name: str) -> FieldInfo | None:
        """The field of the setting whose flat name is ``name`` (``top_k``: ``retrieval.top_k``); None: no setting."""
        if name in FLAT:
            group, field = FLAT[name]
            return GROUPS[group].model_fields[field]
        return cls.model_fields.get(name) if name not in GROUPS else None

    def setting(self, name: str) -> Any:
        """The value of the setting whose flat name is ``name``: ``settings.setting("top_k")``."""
        if name in FLAT:
            group, field = FLAT[name]
            return getattr(getattr(self, group), field)
        return getattr(self, name)

    def updated(self, **changes: Any) -> KBSettings:
        """A validated copy with ``changes`` (flat or grouped names) applied; the one way to change settings.

        Example:
            >>> KBSettings().updated(top_k=50, evidence={"max_evidence_blocks": 3}).retrieval.top_k
            50
        """
        if unknown := sorted(set(flattened(changes)) - set(self.setting_names())):
            raise ValueError(f"unknown setting(s) {', '.join(unknown)}")
        data = self.model_dump()
        for name, value in grouped(changes).items():
            if isinstance(data.get(name), dict) and isinstance(value, Mapping):
                data[name] = {**data[name], **value}
            else:
                data[name] = value
        return type(self).model_validate(data)

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """A copy; with ``update``, :meth:`updated`'s validated one (flat names join their groups, none is junk)."""
        # Always deep: the groups are models, which a shallow copy would share with this one.
        return cast(Self, self.updated(**update)) if update else super().model_copy(deep=True)

    def resolved_milvus_uri(self) -> str:
        """The Milvus URI, defaulting to a Milvus Lite file in the state directory."""
        return self.storage.milvus_uri or str(self.storage.state_dir / "milvus.db")

    def secret_values(self) -> list[str]:
        """Every secret these settings hold: the Milvus token (and its password part), passwords in URLs."""
        found = []
        token = self.storage.milvus_token.get_secret_value()
        if token:
            found += [token, token.split(":", 1)[1]] if ":" in token else [token]
        for url in (self.storage.milvus_uri or "", self.trace.db_url or ""):
            found += url_secrets(url)
        return found

    def mask(self, text: str) -> str:
        """``text`` with these settings' secrets and any URL password replaced by ``***``."""
        return mask_secrets(text, self.secret_values())

    def resolved_trace_db_url(self) -> str:
        """The trace store URL, defaulting to a SQLite file in the state directory."""
        return self.trace.db_url or f"sqlite:///{self.storage.state_dir / 'traces.db'}"

    def resolved_model_cache_dir(self) -> Path:
        """The model cache folder, defaulting to the user's XDG cache folder."""
        if self.embedding.model_cache_dir is not None:
            return self.embedding.model_cache_dir.expanduser()
        xdg = os.environ.get("XDG_CACHE_HOME", "")
        # The XDG spec says a relative value is invalid and must be ignored.
        base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
        return base / "kb-retrieval"

    def is_milvus_server(self) -> bool:
        """True when the URI names a Milvus server rather than a Milvus Lite file."""
        return self.resolved_milvus_uri().startswith(("http://", "https://", "tcp://", "grpc://"))

    def l0_index_path(self) -> Path:
        """Where the L0 index of this collection is persisted."""
        return self.storage.state_dir / "l0" / f"{self.storage.collection}.json"


def __getattr__(name: str) -> Any:
    if name == "Settings":  # the former name: it clashes with llama_index.core.Settings in code importing both
        warnings.warn(
            "kb_retrieval.config.Settings is deprecated: use KBSettings (the same class)",
            DeprecationWarning,
            stacklevel=2,
        )
        return KBSettings
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
