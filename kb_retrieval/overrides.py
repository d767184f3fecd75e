"""Which settings a built pipeline can change for one retriever, query engine or request, and why the others are
refused.

``KnowledgeLookup.with_settings`` (and ``as_retriever(**settings)``, ``as_query_engine(**settings)``, the
server's per-request settings, which all go through it) re-assembles the retrievers and postprocessors with the new
values: every knob they read is honoured. What was fixed when the pipeline was built (the Milvus client and
collection, the collection's schema, the query model, the search plan, the trace store, the sidecar) and what only
ingest reads cannot change there; a different value is refused with the reason, never accepted and ignored. The
same value as the pipeline's is accepted (nothing changes). Names of ``VectorIndexRetriever`` knobs the pipeline
has no use for are refused with what to use instead.

Example:
    >>> from kb_retrieval.config import KBSettings
    >>> check_overrides({"top_k": 50}, KBSettings())
    >>> check_overrides({"collection": "other"}, KBSettings())
    Traceback (most recent call last):
    ...
    kb_retrieval.overrides.UnsupportedOverrideError: collection cannot be overridden: ...
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kb_retrieval.config import KBSettings
from kb_retrieval.scoring_profile import ScoringProfile
from kb_retrieval.settings import flattened

_CONNECTION = (
    "the pipeline holds one Milvus client on one collection, opened when it was built; build another "
    "KnowledgeLookup(KBSettings(...)) for another"
)
_SCHEMA = "read from the collection's schema when the pipeline was built (the collection decides it)"
_MODEL = (
    "the query model is loaded once and must be the one that wrote the collection's vectors; build another "
    "KnowledgeLookup (embed_model=...) over a collection that model wrote"
)
_BUILT = "chosen when the pipeline was built (it decides what was loaded); build another KnowledgeLookup to change it"
_INGEST = "an ingest setting: it shapes what ingest writes, not a lookup; pass it to ingest"
_TRACES = "the trace store is opened once per pipeline; build another KnowledgeLookup for another"
_SIDECAR = "the comparison runner (the sidecar) is started with the pipeline; build another KnowledgeLookup"
_PROFILE_FILE = (
    "the profile file is read once, into scoring, when the settings are made; pass "
    "scoring=load_profile(path) (kb_retrieval.scoring_profile) instead"
)
#: Why a request may not change the scoring profile (in Python, ``with_settings(scoring=...)`` may).
PROFILE_PER_SERVER = (
    "the scoring profile is the server's, chosen as a whole when serve starts (KB_SCORING_PROFILE=<file.json>), so "
    "every trace of the server names one profile version; a request may set lexical_weight and doc_focus_weight"
)

#: Settings fixed when a pipeline is built, each with why.
FIXED: dict[str, str] = {
    **dict.fromkeys(("state_dir", "milvus_uri", "milvus_token", "milvus_timeout_s", "collection"), _CONNECTION),
    **dict.fromkeys(
        (
            "id_field",
            "content_field",
            "vector_field",
            "metadata_field",
            "category_field",
            "source_field",
            "title_field",
            "lexical_text_field",
            "sparse_field",
            "dim",
            "metric",
        ),
        _SCHEMA,
    ),
    **dict.fromkeys(("embed_model", "query_encoder", "model_cache_dir"), _MODEL),
    **dict.fromkeys(("vector_store_mode", "lookup_plan", "state_snapshots", "search_params"), _BUILT),
    **dict.fromkeys(
        (
            "index_type",
            "index_params",
            "consistency_level",
            "category_from",
            "chunk_tokens",
            "chunk_overlap",
            "max_file_bytes",
            "embed_batch_size",
        ),
        _INGEST,
    ),
    **dict.fromkeys(("trace_db_url", "trace_timeout_s", "trace_wait", "trace_query", "trace_content_chars"), _TRACES),
    **dict.fromkeys(("sidecar_enabled", "sidecar_factory"), _SIDECAR),
    "scoring_profile": _PROFILE_FILE,
}

_SCOPE = (
    "scope the lookup with filters=MetadataFilters(filters=[MetadataFilter(key='source', value=[...], "
    "operator=FilterOperator.IN)])"
)
#: ``VectorIndexRetriever`` knobs with no counterpart, and what to use instead.
INSTEAD: dict[str, str] = {
    "vector_store_query_mode": (
        "every lookup is hybrid (dense + BM25, then the rule reranker); lexical_enabled=False for dense only, "
        "lexical_weight for BM25's share"
    ),
    "alpha": "the dense/BM25 balance is lexical_weight (the rerank boost of the best BM25 hit); use it instead",
    "node_ids": f"node ids are chunks of documents; {_SCOPE} (source ids) or key='id' for chunk ids",
    "doc_ids": f"a document is its source id; {_SCOPE}",
    "sparse_top_k": "the BM25 candidates per attempt are lexical_top_k; use it instead",
}


class UnsupportedOverrideError(ValueError):
    """A setting override the pipeline cannot honour (its message names it and says why)."""


def check_overrides(overrides: Mapping[str, Any], current: KBSettings) -> None:
    """Raise :class:`UnsupportedOverrideError` for the first override that cannot be honoured: a name with no
    counterpart (with what to use instead), a setting fixed at build time set to another value (with why), or an
    unknown name (with the valid ones). Settings are named flat (``top_k``) or grouped (``retrieval={"top_k": 50}``).
    """
    try:
        overrides = flattened(overrides)
    except ValueError as error:
        raise UnsupportedOverrideError(str(error)) from None
    names = KBSettings.setting_names()
    for name, value in sorted(overrides.items()):
        if name in FIXED and name in names and current.setting(name) == value:
            continue
        if name in FIXED:
            raise UnsupportedOverrideError(f"{name} cannot be overridden: {FIXED[name]}")
        if name in INSTEAD:
            raise UnsupportedOverrideError(f"{name} is not supported: {INSTEAD[name]}")
        if name in ScoringProfile.model_fields:
            raise UnsupportedOverrideError(
                f"{name} is a weight of the scoring profile, not a setting: pass "
                f"scoring=settings.scoring.variant('<name>', {name}=...) for a profile of your own"
            )
    if unknown := sorted(set(overrides) - set(names)):
        raise UnsupportedOverrideError(f"unknown setting(s) {', '.join(unknown)}; valid: {', '.join(sorted(names))}")


def request_refusal(name: str) -> str:
    """Why a request to the server may not set ``name`` (the settings it may change are the service's own list):
    fixed when the pipeline was built (and why), a knob with no counterpart (and what to use instead), a setting of
    the server (set it when ``serve`` starts), or no setting at all.

    Example:
        >>> request_refusal("lookup_timeout_s")
        'a setting of the server, not of one request: set KB_LOOKUP_TIMEOUT_S when serve starts'
    """
    if name in ("scoring", "scoring_profile") or name in ScoringProfile.model_fields:
        return f"cannot be changed per request: {PROFILE_PER_SERVER}"
    if name in FIXED:
        return f"cannot be changed per request: {FIXED[name]}"
    if name in INSTEAD:
        return f"not supported: {INSTEAD[name]}"
    if name in KBSettings.setting_names():
        return f"a setting of the server, not of one request: set KB_{name.upper()} when serve starts"
    return "no such setting"
