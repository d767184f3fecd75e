"""MetadataFilters -> one escaped Milvus expression (kb_retrieval.retrieval.scope); the expressions run on Milvus in
tests/test_retriever.py."""

from __future__ import annotations

import pytest
from llama_index.core.vector_stores.types import (
    FilterCondition,
    FilterOperator,
    MetadataFilter,
    MetadataFilters,
)

from kb_retrieval.retrieval.scope import FieldTest, ScopeFilterError, scope_expr, scope_of

pytestmark = pytest.mark.unit

SCALAR = {"category": "category", "source": "source", "id": "id"}
KEYS = {"team", "position", "keywords"}


def expr(*filters: MetadataFilter | MetadataFilters, condition: FilterCondition = FilterCondition.AND) -> str | None:
    return scope_expr(
        MetadataFilters(filters=list(filters), condition=condition),
        scalar=SCALAR,
        json_field="metadata",
        json_keys=KEYS,
    )


def test_no_filters_is_no_expression() -> None:
    assert scope_expr(None, scalar=SCALAR, json_field="metadata", json_keys=KEYS) is None
    assert expr() is None


def test_equality_in_nin_and_numbers() -> None:
    assert expr(MetadataFilter(key="category", value="mysql")) == 'category == "mysql"'
    assert (
        expr(MetadataFilter(key="category", value=["mysql", "redis"], operator=FilterOperator.IN))
        == 'category in ["mysql", "redis"]'
    )
    assert (
        expr(MetadataFilter(key="team", value=["sre", "dba"], operator=FilterOperator.NIN))
        == 'not (metadata["team"] == "sre" or metadata["team"] == "dba")'
    )  # a JSON key: `in` on a JSON path is refused by Milvus Lite 3.2
    assert expr(MetadataFilter(key="team", value=["sre"], operator=FilterOperator.IN)) == '(metadata["team"] == "sre")'
    assert expr(MetadataFilter(key="position", value=2, operator=FilterOperator.GTE)) == 'metadata["position"] >= 2'
    assert expr(MetadataFilter(key="position", value=1.5, operator=FilterOperator.LT)) == 'metadata["position"] < 1.5'
    assert (
        expr(MetadataFilter(key="keywords", value="maxmemory", operator=FilterOperator.CONTAINS))
        == 'json_contains(metadata["keywords"], "maxmemory")'
    )


def test_and_or_not_and_nesting() -> None:
    mysql = MetadataFilter(key="category", value="mysql")
    sre = MetadataFilter(key="team", value="sre")
    assert expr(mysql, sre) == 'category == "mysql" and metadata["team"] == "sre"'
    assert expr(mysql, sre, condition=FilterCondition.OR) == 'category == "mysql" or metadata["team"] == "sre"'
    inner = MetadataFilters(filters=[mysql, sre], condition=FilterCondition.OR)
    first = MetadataFilter(key="position", value=0)
    assert expr(first, inner) == 'metadata["position"] == 0 and (category == "mysql" or metadata["team"] == "sre")'
    assert expr(mysql, condition=FilterCondition.NOT) == 'not (category == "mysql")'


def test_values_stay_literals() -> None:
    crafted = 'redis" or category != "'
    assert expr(MetadataFilter(key="category", value=crafted)) == 'category == "redis\\" or category != \\""'


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (MetadataFilter(key="category", value="x", operator=FilterOperator.TEXT_MATCH), "operator 'text_match'"),
        (MetadataFilter(key="category", value=["a"], operator=FilterOperator.ANY), "operator 'any'"),
        (MetadataFilter(key="category", value="x", operator=FilterOperator.CONTAINS), "contains on metadata keys"),
        (MetadataFilter(key="tenant", value="acme"), "filter key 'tenant' is not a field"),
        (MetadataFilter(key="position", value="two", operator=FilterOperator.GT), "needs a number"),
        (MetadataFilter(key="category", value=[], operator=FilterOperator.IN), "non-empty list"),
    ],
)
def test_unsupported_operators_and_unknown_keys_are_errors(bad: MetadataFilter, message: str) -> None:
    with pytest.raises(ScopeFilterError, match=message) as raised:
        expr(bad)
    assert "\n" not in str(raised.value)


def test_the_error_lists_the_known_keys() -> None:
    with pytest.raises(ScopeFilterError, match="known: category, id, keywords, position, source, team"):
        expr(MetadataFilter(key="tenant", value="acme"))
    # A collection without a JSON metadata field has only its scalar fields.
    with pytest.raises(ScopeFilterError, match="known: category, id, source\\)"):
        scope_expr(
            MetadataFilters(filters=[MetadataFilter(key="team", value="sre")]),
            scalar=SCALAR,
            json_field="",
            json_keys=KEYS,
        )


def field_tests_of(*filters: MetadataFilter | MetadataFilters, condition: FilterCondition = FilterCondition.AND):
    found = scope_of(
        MetadataFilters(filters=list(filters), condition=condition),
        scalar=SCALAR,
        json_field="metadata",
        json_keys=KEYS,
    )
    assert found is not None and found.expr == expr(*filters, condition=condition)  # the expression is unchanged
    return found.tests


def test_each_set_operator_on_a_scalar_field_is_a_field_test() -> None:
    assert field_tests_of(MetadataFilter(key="category", value="mysql")) == (
        FieldTest("category", frozenset({"mysql"})),
    )
    assert field_tests_of(MetadataFilter(key="id", value="c1", operator=FilterOperator.NE)) == (
        FieldTest("id", frozenset({"c1"}), negated=True),
    )
    assert field_tests_of(MetadataFilter(key="source", value=["a.md", "b.md"], operator=FilterOperator.IN)) == (
        FieldTest("source", frozenset({"a.md", "b.md"})),
    )
    assert field_tests_of(MetadataFilter(key="category", value=["redis"], operator=FilterOperator.NIN)) == (
        FieldTest("category", frozenset({"redis"}), negated=True),
    )


def test_and_and_nested_and_groups_are_flattened() -> None:
    nested = MetadataFilters(filters=[MetadataFilter(key="id", value="c1", operator=FilterOperator.NE)])
    assert field_tests_of(MetadataFilter(key="category", value="mysql"), nested) == (
        FieldTest("category", frozenset({"mysql"})),
        FieldTest("id", frozenset({"c1"}), negated=True),
    )


@pytest.mark.parametrize(
    ("filters", "condition"),
    [
        ([MetadataFilter(key="team", value="sre")], FilterCondition.AND),  # a JSON metadata key
        ([MetadataFilter(key="position", value=2, operator=FilterOperator.GT)], FilterCondition.AND),  # a range
        ([MetadataFilter(key="category", value="a"), MetadataFilter(key="source", value="b")], FilterCondition.OR),
        ([MetadataFilter(key="category", value="a")], FilterCondition.NOT),
        ([MetadataFilter(key="category", value=3)], FilterCondition.AND),  # a number against a string field
        (
            [
                MetadataFilter(key="category", value="a"),
                MetadataFilters(
                    filters=[MetadataFilter(key="id", value="x"), MetadataFilter(key="id", value="y")],
                    condition=FilterCondition.OR,
                ),
            ],
            FilterCondition.AND,
        ),
    ],
)
def test_anything_else_is_left_to_milvus(filters, condition) -> None:
    assert field_tests_of(*filters, condition=condition) is None
