"""Filter expressions: a value is one string literal that Milvus reads back exactly, never a piece of expression."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from pymilvus import DataType, MilvusClient

from kb_retrieval.retrieval.filters import equals_expr, string_literal

_UNESCAPE = {"\\": "\\", '"': '"', "n": "\n", "r": "\r", "t": "\t"}


def parse_literal(text: str) -> tuple[str, str]:
    """Reference reader for a double-quoted literal at the start of ``text``: (value, what follows it)."""
    assert text[0] == '"', text
    value: list[str] = []
    i = 1
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            escaped = text[i + 1]
            assert escaped in _UNESCAPE, f"unknown escape \\{escaped}"
            value.append(_UNESCAPE[escaped])
            i += 2
        elif ch == '"':
            return "".join(value), text[i + 1 :]
        else:
            assert ch not in "\n\r", "raw line break inside a literal"
            value.append(ch)
            i += 1
    raise AssertionError(f"unterminated literal: {text!r}")


def parse_equals(expr: str) -> tuple[str, str]:
    """(field, value) of ``field == "value"``, asserting nothing else is in the expression."""
    field, sep, rest = expr.partition(" == ")
    assert sep, expr
    value, tail = parse_literal(rest)
    assert tail == "", f"text after the literal: {tail!r}"
    return field, value


CRAFTED = [
    'a" or category != "',
    '" or 1==1 or "',
    "x\\",
    "x\\\\",
    '\\"',
    "y' or 1==1",
    "redis || true",
    "redis && category != ''",
    "line1\nline2",
    "cr\rlf\r\n",
    "tab\there",
    "",
    "  spaced  ",
    "Кэш 缓存 🔥",
]


@pytest.mark.parametrize("value", CRAFTED)
def test_crafted_value_is_one_literal_read_back_exactly(value: str) -> None:
    expr = equals_expr("category", value)
    assert parse_equals(expr) == ("category", value)


def test_known_escapes() -> None:
    assert string_literal('say "hi"') == '"say \\"hi\\""'
    assert string_literal("C:\\temp") == '"C:\\\\temp"'
    assert string_literal("a\nb\rc\td") == '"a\\nb\\rc\\td"'
    assert equals_expr("category", '" or 1==1 or "') == 'category == "\\" or 1==1 or \\""'
    assert equals_expr("category", "redis") == 'category == "redis"'


def test_control_characters_are_kept_not_dropped() -> None:
    # Dropping them would turn "a\x01" into "a" and match another category.
    assert parse_literal(string_literal("a\x01"))[0] == "a\x01"
    assert string_literal("a\x01") != string_literal("a")


@pytest.mark.parametrize(
    "name", ["", "1category", "category == 'x' or 1", "cat-egory", "cat egory", "meta['k']", "ca\ntegory", "é"]
)
def test_invalid_field_names_raise(name: str) -> None:
    with pytest.raises(ValueError, match="field name"):
        equals_expr(name, "redis")


@pytest.mark.parametrize("name", ["category", "_c", "Category_2"])
def test_valid_field_names(name: str) -> None:
    assert equals_expr(name, "v") == f'{name} == "v"'


@given(st.text())
@example("\x00\x01\x7f\u0085\u2028")
@example('\\"\\\\"')
def test_property_literal_reads_back_as_the_value(value: str) -> None:
    assert parse_equals(equals_expr("category", value)) == ("category", value)


# --- against real Milvus Lite ---------------------------------------------------------------------------------------

BASE_CATEGORIES = ["redis", "mysql", "redis", 'a" or category != "', "x\\", "x", "y' or 1==1", "y", "a", ""]


@dataclass
class Store:
    client: MilvusClient
    collection: str
    rows: dict[int, str] = field(default_factory=dict)
    ids: Iterator[int] = field(default_factory=lambda: itertools.count())

    def add(self, categories: list[str]) -> None:
        rows = []
        for category in categories:
            row_id = next(self.ids)
            self.rows[row_id] = category
            rows.append({"id": row_id, "category": category, "vector": [1.0, 0.01 * (row_id % 50), 0.0, 0.5]})
        self.client.insert(self.collection, rows)

    def search_ids(self, expr: str) -> dict[int, str]:
        hits = self.client.search(
            self.collection,
            [[1.0, 0.0, 0.0, 0.5]],
            filter=expr,
            limit=len(self.rows) + 10,
            output_fields=["category"],
            consistency_level="Strong",
        )[0]
        return {hit["id"]: hit["entity"]["category"] for hit in hits}

    def expected(self, category: str) -> set[int]:
        return {row_id for row_id, c in self.rows.items() if c == category}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    client = MilvusClient(str(tmp_path_factory.mktemp("milvus") / "m.db"))
    schema = client.create_schema(auto_id=False)
    schema.add_field("id", DataType.INT64, is_primary=True)
    schema.add_field("category", DataType.VARCHAR, max_length=4096)
    schema.add_field("vector", DataType.FLOAT_VECTOR, dim=4)
    index = client.prepare_index_params()
    index.add_index("vector", index_type="FLAT", metric_type="COSINE")
    client.create_collection("chunks", schema=schema, index_params=index)
    s = Store(client, "chunks")
    s.add(BASE_CATEGORIES)
    client.load_collection("chunks")
    yield s
    client.close()


def test_milvus_plain_category_filter(store: Store) -> None:
    assert set(store.search_ids(equals_expr("category", "redis"))) == store.expected("redis")
    assert len(store.expected("redis")) == 2
    assert store.search_ids(equals_expr("category", "nope")) == {}


@pytest.mark.parametrize("category", [*CRAFTED, "a\x01", "\x00"])
def test_milvus_crafted_category_matches_only_itself(store: Store, category: str) -> None:
    found = store.search_ids(equals_expr("category", category))
    assert set(found.values()) <= {category}
    assert set(found) == store.expected(category)


def test_milvus_crafted_categories_stored_are_found(store: Store) -> None:
    for category in ['a" or category != "', "x\\", "y' or 1==1", ""]:
        found = store.search_ids(equals_expr("category", category))
        assert found and set(found.values()) == {category}


def _near_misses(category: str) -> list[str]:
    """Rows a loose or lossy literal would also match."""
    without_controls = "".join(ch for ch in category if ch >= " " or ch in "\n\r\t")
    return [category, without_controls, category[:-1], category.strip(), category + " ", category.replace("\\", "")]


PIECES = st.sampled_from(['"', "\\", "'", " or ", "1==1", "||", "&&", "\n", "redis", "category", " != ", "(", ")", "%"])


@settings(max_examples=25, deadline=None)
@given(category=st.one_of(st.text(max_size=30), st.lists(PIECES, max_size=8).map("".join)))
@example(category="a\x01")
@example(category='x" or category != "')
def test_property_milvus_filter_returns_exactly_that_category(store: Store, category: str) -> None:
    store.add(_near_misses(category))
    found = store.search_ids(equals_expr("category", category))
    assert set(found.values()) <= {category}
    assert set(found) == store.expected(category)
