"""The query's own check, apart from the pipeline: light enough for a client that only sends the query on.

``transform_query`` (stage 1) uses it; so do the CLI (every query checked before the first lookup) and the
``serve`` client, which must not import LlamaIndex or Milvus to say a query is empty.

Example:
    >>> normalize_query("  RedisMemoryHigh\\x00 on cache-01 ", 4000)
    ('RedisMemoryHigh on cache-01', False)
"""

from __future__ import annotations

import re

from kb_retrieval.knowledge.text import clean_text

#: A surrogate code point in a Python string is a lone one (a JSON pair such as \ud83d\ude00 decodes to one
#: character): not Unicode text, and no UTF-8 writer (a response, a trace row, a terminal) can encode it.
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


class EmptyQueryError(ValueError):
    """The query is empty or only whitespace/control characters, or not Unicode text (a lone surrogate)."""


def normalize_query(query: object, max_query_chars: int) -> tuple[str, bool]:
    """The query as the pipeline searches it (cut to ``max_query_chars``, cleaned, on one line) and whether it was
    cut. Raises ``EmptyQueryError`` for a query that is not a string, holds a lone surrogate or is empty once
    cleaned."""
    if not isinstance(query, str):
        raise EmptyQueryError(f"query must be a string, got {type(query).__name__}")
    if (bad := _LONE_SURROGATE.search(query)) is not None:
        raise EmptyQueryError(
            f"query is not Unicode text: a lone surrogate (U+{ord(bad.group()):04X}) at character {bad.start()}"
        )
    truncated = len(query) > max_query_chars
    normalized = clean_text(query[:max_query_chars] if truncated else query).replace("\n", " ")
    if not normalized:
        raise EmptyQueryError("query is empty: pass a question or an alert text")
    return normalized, truncated
