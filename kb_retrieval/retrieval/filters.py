"""Milvus filter expressions built from values, never from pasted text.

A value is always written as one double-quoted string literal with backslashes, quotes, newlines, returns and tabs
escaped, so a category holding quotes, ``or 1==1`` or operators stays a literal: it can neither break the
expression nor widen it.

Example:
    >>> equals_expr("category", 'redis" or category != "')
    'category == "redis\\\\" or category != \\\\""'
"""

from __future__ import annotations

import re

_FIELD = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def string_literal(value: str) -> str:
    """``value`` as a Milvus double-quoted string literal."""
    # Other control characters have no escape in Milvus' grammar (no \x or \u) but are accepted raw inside a literal;
    # dropping them would change the value and could widen the filter ("a\x01" matching "a").
    escaped = "".join(_ESCAPES.get(ch, ch) for ch in value)
    return f'"{escaped}"'


def field_name(field: str) -> str:
    """``field`` when it is a plain identifier (what an expression may name), else a ``ValueError``."""
    if not _FIELD.match(field):
        raise ValueError(f"not a valid Milvus field name: {field!r}")
    return field


def equals_expr(field: str, value: str) -> str:
    """``field == "value"``; the field name must be a plain identifier."""
    return f"{field_name(field)} == {string_literal(value)}"


def in_expr(field: str, values: list[str]) -> str:
    """``field in ["a", "b"]``; every value escaped like :func:`equals_expr`."""
    return f"{field_name(field)} in [{', '.join(string_literal(v) for v in values)}]"
