"""Stage 1: normalise the query, ask L0 for hints, choose the L1 filter.

Exactly one nonblank L0 domain becomes a category filter; zero or several mean no filter (a domain comes from strong
matches only, which the filter reason names: see :mod:`kb_retrieval.retrieval.l0_hints`). The filter is a hard cut,
so it is set only when every document L0 matched for the query by a title or a specific keyword (an identifier or a
phrase; a plain word boosts and neither sets nor stops a filter) lies in that domain: L0 never cuts away a document
it matched itself (a question naming one page of a domain and matching a page of another by name, e.g. a
specification and the migration guide that names it, is searched whole). A query over
``max_query_chars`` is truncated (bounded work whatever the caller sends) and the trace says so. kubectl's short
resource names are read as the kinds they name (``sts/kafka`` is a StatefulSet: see
:mod:`kb_retrieval.retrieval.short_names`), noted; the normalised query is what every layer searches.
"""

from __future__ import annotations

from llama_index.core.instrumentation import get_dispatcher

from kb_retrieval.models import L0Hints, QueryTransform
from kb_retrieval.retrieval.events import span
from kb_retrieval.retrieval.l0_hints import L0HintProvider
from kb_retrieval.retrieval.query_check import EmptyQueryError, normalize_query
from kb_retrieval.retrieval.short_names import expand_short_names

__all__ = ["EmptyQueryError", "transform_query"]

dispatcher = get_dispatcher(__name__)


@span(dispatcher)
def transform_query(
    query: str, l0: L0HintProvider | None, max_query_chars: int, *, read_short_names: bool = True
) -> QueryTransform:
    """The query as the lookup searches it: normalised, short names read, L0 hints and the category filter."""
    normalized, truncated = normalize_query(query, max_query_chars)
    original = query
    notes = [f"query truncated from {len(original)} to {max_query_chars} characters"] if truncated else []
    if read_short_names:
        normalized, readings = expand_short_names(normalized)
        if readings:
            notes.append(f"kubectl short names read as kinds: {', '.join(readings)}")

    hints = l0.hints(normalized) if l0 is not None else None
    domains = [d for d in (hints.domains if hints else []) if d.strip()]
    outside = l0.outside(domains[0], hints) if l0 is not None and hints and len(domains) == 1 else {}
    if outside:
        category, reason = None, _not_narrowed(domains[0], outside)
    elif len(domains) == 1:
        why = "; ".join(hints.domain_matches.get(domains[0], [])) if hints else ""
        category, reason = domains[0], f"exactly one L0 domain: {domains[0]}" + (f", set by {why}" if why else "")
    elif domains:
        category, reason = None, f"ambiguous: {len(domains)} L0 domains ({', '.join(domains)})"
    else:
        category, reason = None, "no L0 domain"
    return QueryTransform(
        original_query=original if not truncated else original[:max_query_chars],
        normalized_query=normalized,
        truncated=truncated,
        notes=notes,
        hints=hints if hints is not None else L0Hints(),
        category_filter=category,
        filter_reason=reason,
    )


def _not_narrowed(domain: str, outside: dict[str, str]) -> str:
    """The filter reason when L0's one domain is not a filter: the first document it would cut away (and how many)."""
    source, other = next(iter(outside.items()))
    more = f" and {len(outside) - 1} more" if len(outside) > 1 else ""
    return f"not narrowed to {domain}: L0 also matched {source} (domain {other or 'none'}){more}"
