"""Request and response contracts of the HTTP API.

A lookup's answer is the pipeline's own ``LookupResult`` JSON (``kb_retrieval.output.result_json``), not a model
of this module: the server adds nothing to it.
"""

from __future__ import annotations

import copy
from typing import Annotated, Any, Literal, Optional

from llama_index.core.vector_stores.types import FilterOperator, MetadataFilter, MetadataFilters
from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, create_model, field_validator

from kb_retrieval.config import KBSettings
from kb_retrieval.retrieval.query_check import normalize_query
from kb_retrieval.retrieval.scope import SUPPORTED_OPERATORS
from kb_retrieval.tool import QUERY_DESCRIPTION

#: Settings a request may change for its own lookup: what a retrieval test compares (how many candidates, the
#: thresholds, document ranking, BM25, the budget). Locations, models and the trace store are the server's.
OVERRIDABLE = (
    "top_k",
    "max_evidence_blocks",
    "reference_threshold",
    "evidence_threshold",
    "evidence_follows_ranking",
    "evidence_fills_by_ranking",
    "lexical_enabled",
    "lexical_top_k",
    "lexical_weight",
    "doc_focus_weight",
    "document_ranking",
    "content_interleave",
    "expand_documents",
    "context_budget_tokens",
)


def _optional(name: str) -> tuple[Any, Any]:
    """The setting's own type and constraints (from ``KBSettings``), optional: ``None`` keeps the server's value."""
    field = KBSettings.setting_field(name)
    assert field is not None, name  # OVERRIDABLE names settings
    info = copy.copy(field)
    info.default = None
    info.default_factory = None
    return Optional[info.annotation], info  # noqa: UP045 (a runtime type, built here)


#: The setting overrides a request may carry: each validated like the setting itself; an unknown name is an error.
LookupOverrides: type[BaseModel] = create_model(  # type: ignore[call-overload]
    "LookupOverrides",
    __config__=ConfigDict(extra="forbid"),
    **{name: _optional(name) for name in OVERRIDABLE},
)


class ScopeFilter(MetadataFilter):
    """One filter of a request's scope: LlamaIndex's ``MetadataFilter`` (``key``, ``value``, ``operator``, ``==``
    when left out), refusing a field it does not have and an operator a scope cannot translate."""

    model_config = ConfigDict(extra="forbid")

    @field_validator("operator", mode="before")
    @classmethod
    def _supported(cls, value: Any) -> Any:
        name = value.value if isinstance(value, FilterOperator) else value
        if name not in SUPPORTED_OPERATORS:
            raise ValueError(f"{name!r} is not supported (supported: {', '.join(SUPPORTED_OPERATORS)})")
        return value

    @field_validator("value", mode="before")
    @classmethod
    def _one_kind(cls, value: Any) -> Any:
        # LlamaIndex's union of strict types would otherwise answer a wrong value with one error per member.
        items = value if isinstance(value, list) else [value]
        kinds = {"string" if isinstance(v, str) else "number" if _is_number(v) else "other" for v in items}
        if "other" in kinds or len(kinds) > 1:
            raise ValueError("must be a string, a number, or a list of strings or of numbers")
        return value


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


#: The tags telling a filter from a nested group (they show in a validation error's location).
FILTER_KINDS = ("filter", "group")


def _filter_kind(value: Any) -> str:
    """A nested group has ``filters``, a filter has not (LlamaIndex's JSON carries no type tag): telling them apart
    first makes an error name the one thing wrong instead of how the input fails every kind."""
    has_filters = "filters" in value if isinstance(value, dict) else isinstance(value, MetadataFilters)
    return "group" if has_filters else "filter"


class ScopeFilters(MetadataFilters):
    """A request's scope: LlamaIndex's ``MetadataFilters`` JSON (filters, nested groups, ``condition`` and, or, not),
    what ``KnowledgeLookup.lookup(query, filters=...)`` takes. A key the collection does not have is refused by the
    lookup (``ScopeFilterError``), as in process.

    Example:
        >>> ScopeFilters.model_validate({"filters": [{"key": "category", "value": "mysql"}]}).filters[0].operator
        <FilterOperator.EQ: '=='>
    """

    model_config = ConfigDict(extra="forbid")

    filters: list[  # type: ignore[assignment]  # LlamaIndex's own union, each kind stricter
        Annotated[
            Annotated[ScopeFilter, Tag("filter")] | Annotated[ScopeFilters, Tag("group")],
            Discriminator(_filter_kind),
        ]
    ]


class LookupRequest(BaseModel):
    """``POST /v1/lookup``: a query, an optional scope and setting overrides for this lookup only.

    Example:
        >>> LookupRequest(query="RedisMemoryHigh on cache-01", settings={"max_evidence_blocks": 3}).overrides()
        {'max_evidence_blocks': 3}
        >>> request = LookupRequest(query="replica lag", filters={"filters": [{"key": "category", "value": "mysql"}]})
        >>> request.filters.filters[0]
        ScopeFilter(key='category', value='mysql', operator=<FilterOperator.EQ: '=='>)
    """

    model_config = ConfigDict(extra="forbid")

    query: str = Field(description=QUERY_DESCRIPTION)
    filters: ScopeFilters | None = Field(
        default=None,
        description="The lookup's scope, as LlamaIndex's MetadataFilters JSON: every Milvus request carries it. Keys: "
        "the collection's fields (category, source, id) and the metadata keys ingest recorded; operators: "
        + ", ".join(SUPPORTED_OPERATORS)
        + "; condition and, or, not; groups nest.",
        examples=[{"filters": [{"key": "category", "value": "mysql", "operator": "=="}], "condition": "and"}],
    )
    settings: LookupOverrides | None = Field(  # type: ignore[valid-type]
        default=None, description="Setting overrides for this lookup only (the others are the server's)."
    )

    @field_validator("query")
    @classmethod
    def _not_empty(cls, value: str) -> str:
        normalize_query(value, len(value) + 1)  # EmptyQueryError is a ValueError: a 422 naming the field
        return value

    def overrides(self) -> dict[str, Any]:
        """The overrides given (``None`` ones dropped)."""
        return self.settings.model_dump(exclude_none=True) if self.settings is not None else {}


class Alert(BaseModel):
    """One alert of an Alertmanager webhook payload (version 4)."""

    model_config = ConfigDict(extra="allow")

    status: Literal["firing", "resolved"] | str = "firing"
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    fingerprint: str = ""
    startsAt: str | None = None  # Alertmanager's own (camelCase) names
    endsAt: str | None = None
    generatorURL: str | None = None


class AlertmanagerPayload(BaseModel):
    """What Alertmanager posts to a webhook receiver (``version`` "4"); extra fields are kept, not required."""

    model_config = ConfigDict(extra="allow")

    version: str = "4"
    receiver: str = ""
    status: str = ""
    alerts: list[Alert]


class AlertResult(BaseModel):
    """One alert's answer: its name and fingerprint, the query built from it, and the lookup's result (or why none
    ran)."""

    alertname: str
    fingerprint: str
    status: str
    query: str | None = None
    skipped: str | None = Field(default=None, description="Why no lookup ran (a resolved alert, nothing to search).")
    error: str | None = Field(
        default=None,
        description="Why this alert has no result while the others have theirs (text that is not Unicode, no "
        "worker free before the deadline, a failed lookup): one line.",
    )
    result: dict[str, Any] | None = Field(default=None, description="The lookup's result, as /v1/lookup answers it.")


class AlertmanagerResponse(BaseModel):
    """The answer to an Alertmanager webhook: the alerts received, looked up, skipped or failed, and each result."""

    receiver: str
    alerts: int
    looked_up: int
    skipped: int
    failed: int = Field(default=0, description="Alerts with an error entry instead of a result.")
    results: list[AlertResult]


class Health(BaseModel):
    """The health answer: whether the knowledge base can be searched, and what it is."""

    status: Literal["ok", "unavailable"]
    collection: str
    milvus: Literal["lite", "server"]
    chunks: int | None = None
    lexical_mode: str
    index_version: str | None = None
    reason: str | None = None


class TraceRows(BaseModel):
    """The latest trace rows, newest first."""

    rows: list[dict[str, Any]] = Field(description="The latest tool_invocation rows, newest first.")


class ErrorBody(BaseModel):
    """The body of an error answer: the error in one line."""

    error: str
