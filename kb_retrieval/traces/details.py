"""What a trace row says of one lookup (``retrieval_details``), and how it keeps the query: in full, hashed or
redacted (``KB_TRACE_QUERY``), with text no database stores (lone surrogates) replaced by U+FFFD.

Example:
    >>> stored_query("RedisMemoryHigh on cache-01", "redact")
    '[redacted: 27 characters]'
"""

from __future__ import annotations

import hashlib
import re
from typing import Any, Literal

from kb_retrieval.models import LookupResult
from kb_retrieval.sidecar_protocol import disabled_entry

QueryMode = Literal["full", "hash", "redact"]
_SURROGATE = re.compile("[\ud800-\udfff]")


def retrieval_details(
    result: LookupResult,
    content_chars: int = 160,
    sidecar: dict[str, Any] | None = None,
    scoring_profile: str | None = None,
) -> dict[str, Any]:
    """The compact trace of one call (snake_case keys, as the spec names them).

    ``sidecar`` is the compact run of the sidecar (any runner of ``kb_retrieval.sidecar_protocol``) when one ran
    beside the lookup; without one the entry says ``disabled``. ``scoring_profile``: the version of the scoring
    profile the lookup read (``KBSettings.scoring.version``), so a row says which weights ranked it.

    The details share no object with ``result`` (its lists and dicts are copied or dumped): the trace store's
    writer thread finishes them (:func:`private_details`) after the lookup has returned the result to its caller.
    """
    hints = result.query_transform.hints
    transform = result.query_transform.model_dump(mode="json")
    return {
        "query_transform": transform,
        "l0_hints": {
            "keywords": list(hints.matched_keywords),
            "domains": list(hints.domains),
            "entities": list(hints.entities),
            "titles": list(hints.matched_titles),
            "title_coverage": dict(hints.title_coverage),
        },
        "retrieval_trace": result.retrieval_trace.model_dump(mode="json"),
        "fallback_reason": result.retrieval_trace.fallback_reason,
        "rerank_trace": result.rerank_trace.model_dump(mode="json"),
        "context_pack_summary": result.context_pack.summary.model_dump(mode="json"),
        "evidence_blocks": [
            {
                "source": b.source,
                "title": b.title,
                "breadcrumb": b.breadcrumb,
                "retrieval_layer": b.retrieval_layer,
                "score": b.score,
                "similarity": b.similarity,
                "hit_reasons": list(b.hit_reasons),
                "content_preview": b.content[:content_chars],
                "content_truncated": len(b.content) > content_chars,
            }
            for b in result.evidence_blocks
        ],
        "candidate_count": result.retrieval_trace.candidate_count,
        "final_count": result.retrieval_trace.final_count,
        "relevance_level": result.relevance_level,
        "completeness_hint": result.completeness_hint,
        "stage_ms": dict(result.stage_ms),
        "sidecar": sidecar if sidecar is not None else disabled_entry(),
        "scoring_profile": scoring_profile,
    }


def stored_query(text: str, mode: QueryMode) -> str:
    """The query as trace rows keep it: in full, as ``sha256:<hex>``, or as ``[redacted: N characters]``."""
    if mode == "hash":
        return "sha256:" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    if mode == "redact":
        return f"[redacted: {len(text)} characters]"
    return _SURROGATE.sub("\ufffd", text)


def private_details(details: dict[str, Any], mode: QueryMode) -> dict[str, Any]:
    """``details`` (:func:`retrieval_details`) with the query texts kept as ``mode`` says and only storable text."""
    if mode != "full":  # the query is in the transform (as given and normalised) and in each attempt
        transform = details["query_transform"]
        for key in ("original_query", "normalized_query"):
            transform[key] = stored_query(transform[key], mode)
        for attempt in details["retrieval_trace"]["attempts"]:
            attempt["query"] = stored_query(attempt["query"], mode)
    stored: dict[str, Any] = storable(details)
    return stored


def storable(value: Any) -> Any:
    """``value`` (JSON details) with lone surrogates, which no database stores, replaced by U+FFFD."""
    kind = type(value)
    # A row holds a few hundred values, most of them numbers and ASCII strings: those are kept in the comprehension
    # itself, without a call each (a third of the walk's time).
    if kind is dict:
        return {
            key: item if type(item) in _AS_THEY_ARE or (type(item) is str and item.isascii()) else storable(item)
            for key, item in value.items()
        }
    if kind is list:
        return [
            item if type(item) in _AS_THEY_ARE or (type(item) is str and item.isascii()) else storable(item)
            for item in value
        ]
    if isinstance(value, str):
        return value if value.isascii() else _SURROGATE.sub("\ufffd", value)  # most are ASCII: no surrogate
    if isinstance(value, dict):
        return {key: storable(item) for key, item in value.items()}
    if isinstance(value, list):
        return [storable(item) for item in value]
    return value


#: Value types a row stores as they are.
_AS_THEY_ARE = frozenset({int, float, bool, type(None)})
