"""The query's own check, apart from the pipeline: light enough for a client that only sends the query on.

``transform_query`` (stage 1) uses it; so do the CLI (every query checked before the first lookup) and the
``serve`` client, which must not import LlamaIndex or Milvus to say a query is empty.

Example:
    >>> normalize_query("  RedisMemoryHigh\\x00 on cache-01 ", 4000)
    ('RedisMemoryHigh on cache-01', False)
"""

from __future__ import annotations

from kb_retrieval.knowledge.text import clean_text


class EmptyQueryError(ValueError):
    """The query is empty or only whitespace/control characters."""


def normalize_query(query: object, max_query_chars: int) -> tuple[str, bool]:
    """The query as the pipeline searches it (cut to ``max_query_chars``, cleaned, on one line) and whether it was
    cut. Raises ``EmptyQueryError`` for a query that is not a string or is empty once cleaned."""
    if not isinstance(query, str):
        raise EmptyQueryError(f"query must be a string, got {type(query).__name__}")
    truncated = len(query) > max_query_chars
    normalized = clean_text(query[:max_query_chars] if truncated else query).replace("\n", " ")
    if not normalized:
        raise EmptyQueryError("query is empty: pass a question or an alert text")
    return normalized, truncated
