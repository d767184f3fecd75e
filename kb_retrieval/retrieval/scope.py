"""A lookup's scope: LlamaIndex ``MetadataFilters`` as one escaped Milvus expression.

A scope is the caller's (a tenant, a team, a category): every Milvus request of every attempt carries it, the
filtered attempt and the unfiltered retry alike, and the L0 category filter (a hint) is combined with it by AND.
Candidates that come from outside a Milvus search (exact identifiers, in-process BM25) join only through a Milvus
request under the scope, so nothing outside it reaches the evidence.

Keys are the collection's scalar fields (``category``, ``source``, ``id``) and the metadata keys ingest recorded
(the frontmatter keys, ``title``, ``kb``, ...), which are read from the chunk's JSON metadata field. Values are
literals written by :mod:`kb_retrieval.retrieval.filters` (strings escaped, numbers as numbers); an operator this
module cannot translate, or a key the collection does not have, is an error naming it.

Note: a filter on a JSON metadata key is slow on Milvus Lite at scale (~200 ms at 10k chunks, measured); a real
scalar field (``category``) is fast.

A :class:`Scope` carries the expression and, when the scope is only equality tests on scalar fields joined by AND
(``==``, ``!=``, ``in``, ``nin`` with string values), the same tests as :class:`FieldTest` s, which the memory
plan's mirror evaluates as a row mask (:meth:`~kb_retrieval.retrieval.l1.memory.MemoryMirror.scope_mask`) instead of
sending the search to Milvus; anything else (a JSON metadata key, a range, ``or``/``not``, a number) only Milvus
evaluates.

Example:
    >>> from llama_index.core.vector_stores import MetadataFilter, MetadataFilters
    >>> filters = MetadataFilters(filters=[MetadataFilter(key="category", value="mysql")])
    >>> scope_expr(filters, scalar={"category": "category"}, json_field="metadata", json_keys=set())
    'category == "mysql"'
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from llama_index.core.vector_stores.types import FilterCondition, FilterOperator, MetadataFilter, MetadataFilters

from kb_retrieval.retrieval.filters import field_name, string_literal

_COMPARISONS = {
    FilterOperator.EQ: "==",
    FilterOperator.NE: "!=",
    FilterOperator.GT: ">",
    FilterOperator.GTE: ">=",
    FilterOperator.LT: "<",
    FilterOperator.LTE: "<=",
}
#: The operators a scope can use, as their LlamaIndex names.
SUPPORTED_OPERATORS = (*(op.value for op in _COMPARISONS), "in", "nin", "contains")


class ScopeFilterError(ValueError):
    """A ``MetadataFilters`` scope that cannot be translated: an unsupported operator or condition, an unknown key,
    or a value of the wrong kind."""


@dataclass(frozen=True)
class FieldTest:
    """One test of a scalar field against string values: the value is one of ``values`` (``==``, ``in``), or, when
    ``negated``, none of them (``!=``, ``nin``)."""

    field: str
    values: frozenset[str]
    negated: bool = False


@dataclass(frozen=True)
class Scope:
    """A lookup's scope: ``expr`` on every Milvus request; ``tests``, AND-ed, the same scope as field tests a mirror
    can evaluate, or ``None`` when only Milvus can (see the module)."""

    expr: str
    tests: tuple[FieldTest, ...] | None = None


def scope_of(
    filters: MetadataFilters | None,
    *,
    scalar: Mapping[str, str],
    json_field: str,
    json_keys: set[str],
) -> Scope | None:
    """``filters`` as a :class:`Scope` (arguments as :func:`scope_expr`'s); ``None`` when there are none."""
    expr = scope_expr(filters, scalar=scalar, json_field=json_field, json_keys=json_keys)
    if expr is None or filters is None:
        return None
    return Scope(expr, field_tests(filters, scalar))


_SET_TESTS = {FilterOperator.EQ: False, FilterOperator.IN: False, FilterOperator.NE: True, FilterOperator.NIN: True}


def field_tests(filters: MetadataFilters, scalar: Mapping[str, str]) -> tuple[FieldTest, ...] | None:
    """The scope as AND-ed :class:`FieldTest` s, or ``None`` when a part of it is not one (another operator or
    condition, a key that is no scalar field, a value that is no string)."""
    if (filters.condition or FilterCondition.AND) != FilterCondition.AND:
        return None
    tests: list[FieldTest] = []
    for f in filters.filters:
        if isinstance(f, MetadataFilters):
            inner = field_tests(f, scalar)
            if inner is None:
                return None
            tests.extend(inner)
            continue
        op = FilterOperator(f.operator)
        values = f.value if isinstance(f.value, list) else [f.value]
        if f.key not in scalar or op not in _SET_TESTS or not all(isinstance(v, str) for v in values):
            return None
        tests.append(FieldTest(scalar[f.key], frozenset(str(v) for v in values), _SET_TESTS[op]))
    return tuple(tests)


def scope_expr(
    filters: MetadataFilters | None,
    *,
    scalar: Mapping[str, str],
    json_field: str,
    json_keys: set[str],
) -> str | None:
    """The Milvus expression of ``filters``; ``None`` when there are none.

    ``scalar`` maps a filter key to the collection's scalar field; ``json_keys`` are the keys of the JSON metadata
    field ``json_field`` the collection's rows hold (``''``: no such field).
    """
    if filters is None or not filters.filters:
        return None
    return _group(filters, scalar, json_field, json_keys)


def _group(filters: MetadataFilters, scalar: Mapping[str, str], json_field: str, json_keys: set[str]) -> str:
    parts = [
        f"({_group(f, scalar, json_field, json_keys)})"
        if isinstance(f, MetadataFilters)
        else _one(f, scalar, json_field, json_keys)
        for f in filters.filters
    ]
    condition = filters.condition or FilterCondition.AND
    if condition == FilterCondition.NOT:
        return f"not ({' and '.join(parts)})"
    if condition not in (FilterCondition.AND, FilterCondition.OR):
        raise ScopeFilterError(f"filter condition {condition!r} is not supported (use and, or, not)")
    return f" {condition.value} ".join(parts)


def _one(f: MetadataFilter, scalar: Mapping[str, str], json_field: str, json_keys: set[str]) -> str:
    target = _target(f.key, scalar, json_field, json_keys)
    op = FilterOperator(f.operator)
    value = f.value
    if op in _COMPARISONS:
        if op not in (FilterOperator.EQ, FilterOperator.NE) and not _is_number(value):
            raise ScopeFilterError(f"filter {f.key!r} {op.value}: needs a number, got {value!r}")
        return f"{target} {_COMPARISONS[op]} {_literal(f.key, value)}"
    if op in (FilterOperator.IN, FilterOperator.NIN):
        if not isinstance(value, list) or not value:
            raise ScopeFilterError(f"filter {f.key!r} {op.value}: needs a non-empty list, got {value!r}")
        if target.startswith(f"{json_field}["):
            # Milvus Lite 3.2 refuses `in` on a JSON path ("left side of 'in' must be a field reference"): the same
            # test as equalities joined by OR.
            any_of = " or ".join(f"{target} == {_literal(f.key, v)}" for v in value)
            return f"({any_of})" if op == FilterOperator.IN else f"not ({any_of})"
        listed = ", ".join(_literal(f.key, v) for v in value)
        return f"{target} {'in' if op == FilterOperator.IN else 'not in'} [{listed}]"
    if op == FilterOperator.CONTAINS and target.startswith(f"{json_field}["):
        return f"json_contains({target}, {_literal(f.key, value)})"
    raise ScopeFilterError(
        f"filter {f.key!r}: operator {op.value!r} is not supported "
        f"(supported: {', '.join(SUPPORTED_OPERATORS)}; contains on metadata keys only)"
    )


def _target(key: str, scalar: Mapping[str, str], json_field: str, json_keys: set[str]) -> str:
    if key in scalar:
        return field_name(scalar[key])
    if json_field and key in json_keys:
        return f"{field_name(json_field)}[{string_literal(key)}]"
    known = sorted({*scalar, *(json_keys if json_field else set())})
    raise ScopeFilterError(f"filter key {key!r} is not a field of the collection (known: {', '.join(known)})")


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _literal(key: str, value: object) -> str:
    if isinstance(value, str):
        return string_literal(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if _is_number(value):
        return repr(value)
    raise ScopeFilterError(f"filter {key!r}: value {value!r} is neither a string nor a finite number")
