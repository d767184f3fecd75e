"""The one JSON text of a lookup result: what ``lookup --json`` prints and ``POST /v1/lookup`` answers."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kb_retrieval.output import result_json

pytestmark = pytest.mark.unit

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=30,
)


@given(st.dictionaries(st.text(max_size=12), _JSON, max_size=6), st.none() | st.text(max_size=8))
def test_the_text_is_json_dumps_byte_for_byte(result, case_id):
    # The bytes clients and scripts have always received: json.dumps's separators, non-ASCII text kept as it is.
    expected = json.dumps(result if case_id is None else {"caseId": case_id, **result}, ensure_ascii=False)
    assert result_json(result, case_id) == expected


def test_non_ascii_text_is_kept_and_the_case_id_comes_first():
    text = result_json({"title": "Ünïcode 中文", "score": 0.5}, "q1")
    assert text == '{"caseId": "q1", "title": "Ünïcode 中文", "score": 0.5}'
