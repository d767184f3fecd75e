"""Request and response contracts of the HTTP API.

A lookup's answer is the pipeline's own ``LookupResult`` JSON (``kb_retrieval.output.result_json``), not a model
of this module: the server adds nothing to it.
"""

from __future__ import annotations

import copy
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator

from kb_retrieval.config import KBSettings
from kb_retrieval.retrieval.query_check import normalize_query
from kb_retrieval.tool import QUERY_DESCRIPTION

#: Settings a request may change for its own lookup: what a retrieval test compares (how many candidates, the
#: thresholds, document ranking, BM25, the budget). Locations, models and the trace store are the server's.
OVERRIDABLE = (
    "top_k",
    "max_evidence_blocks",
    "reference_threshold",
    "evidence_threshold",
    "evidence_follows_ranking",
    "lexical_enabled",
    "lexical_top_k",
    "lexical_weight",
    "doc_focus_weight",
    "document_ranking",
    "expand_documents",
    "context_budget_tokens",
)


def _optional(name: str) -> tuple[Any, Any]:
    """The setting's own type and constraints (from ``KBSettings``), optional: ``None`` keeps the server's value."""
    info = copy.copy(KBSettings.model_fields[name])
    info.default = None
    info.default_factory = None
    return Optional[info.annotation], info  # noqa: UP045 (a runtime type, built here)


#: The setting overrides a request may carry: each validated like the setting itself; an unknown name is an error.
LookupOverrides: type[BaseModel] = create_model(  # type: ignore[call-overload]
    "LookupOverrides",
    __config__=ConfigDict(extra="forbid"),
    **{name: _optional(name) for name in OVERRIDABLE},
)


class LookupRequest(BaseModel):
    """``POST /v1/lookup``: a query, and setting overrides for this lookup only.

    Example:
        >>> LookupRequest(query="RedisMemoryHigh on cache-01", settings={"max_evidence_blocks": 3}).settings
        LookupOverrides(top_k=None, max_evidence_blocks=3, ...)  # doctest: +SKIP
    """

    model_config = ConfigDict(extra="forbid")

    query: str = Field(description=QUERY_DESCRIPTION)
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
    result: dict[str, Any] | None = Field(default=None, description="The lookup's result, as /v1/lookup answers it.")


class AlertmanagerResponse(BaseModel):
    receiver: str
    alerts: int
    looked_up: int
    skipped: int
    results: list[AlertResult]


class Health(BaseModel):
    status: Literal["ok", "unavailable"]
    collection: str
    milvus: Literal["lite", "server"]
    chunks: int | None = None
    lexical_mode: str
    index_version: str | None = None
    reason: str | None = None


class TraceRows(BaseModel):
    rows: list[dict[str, Any]] = Field(description="The latest tool_invocation rows, newest first.")


class ErrorBody(BaseModel):
    error: str
