"""Stage data on a node: read back as written (no second validation), and still right when a node was copied,
serialised or had its text replaced by another postprocessor; and the rule reranker's content and breadcrumb
matches, whose word splitting is skipped only when it cannot match."""

from __future__ import annotations

import copy
import json

import pytest
from llama_index.core.schema import NodeWithScore, TextNode

from kb_retrieval.models import Candidate, L0Hints, QueryTransform, ScoreLabel
from kb_retrieval.retrieval.hybrid import LookupQuery
from kb_retrieval.retrieval.rerank import RuleReranker
from kb_retrieval.retrieval.stage import STAGE_KEY, StageData, candidate_node, stage_of, write_stage
from tests.support.candidates import cand

pytestmark = pytest.mark.unit


def test_stage_data_is_read_back_as_written_without_validating_again(monkeypatch):
    node = candidate_node(cand("a", "a.md", 0.5), lexical_score=0.75)
    first = stage_of(node)

    def no_validation(*args: object, **kwargs: object) -> StageData:
        raise AssertionError("validated again")

    monkeypatch.setattr(StageData, "model_validate", no_validation)
    assert stage_of(node) is first and first.lexical_score == 0.75
    first.merged_chunks = 3
    write_stage(node, first)
    assert stage_of(node).merged_chunks == 3 == node.node.metadata[STAGE_KEY]["merged_chunks"]


def test_metadata_stays_plain_json_and_a_round_trip_is_validated():
    node = candidate_node(cand("a", "a.md", 0.5), exact_terms=["max_connections"], exact_df=1)
    raw = node.node.metadata[STAGE_KEY]
    assert "content" not in raw["candidate"]  # the node's text is the content
    metadata = json.loads(json.dumps({STAGE_KEY: raw}))  # what a docstore or a tracing exporter keeps
    restored = NodeWithScore(node=TextNode(id_="a", text="text of a", metadata=metadata))
    data = stage_of(restored)
    assert data.candidate.content == "text of a" and data.exact_terms == ["max_connections"] and data.exact_df == 1
    assert TextNode.model_validate_json(node.node.model_dump_json()).metadata[STAGE_KEY] == raw


def test_copies_are_independent_and_replaced_text_is_seen():
    node = candidate_node(cand("a", "a.md", 0.5))
    twin = copy.deepcopy(node)
    stage_of(twin).merged_chunks = 7
    assert stage_of(node).merged_chunks == 1
    node.node.set_content("replaced by another postprocessor")
    assert stage_of(node).candidate.content == "replaced by another postprocessor"


def test_a_node_class_with_its_own_content_is_read_through_get_content():
    class Summarised(TextNode):
        def get_content(self, metadata_mode: object = None) -> str:  # type: ignore[override]
            return f"summary of {self.text}"

    written = candidate_node(cand("a", "a.md", 0.5))
    node = NodeWithScore(node=Summarised(id_="a", text="a", metadata=written.node.metadata), score=0.5)
    assert stage_of(node).candidate.content == "summary of a"


def _candidate(content: str, breadcrumb: str | None = None) -> Candidate:
    return Candidate(
        chunk_id="c",
        source="c.md",
        content=content,
        breadcrumb=breadcrumb,
        score=0.5,
        score_label=ScoreLabel.COSINE,
        path="sdk",
        similarity=0.5,
    )


@pytest.mark.parametrize(
    ("content", "breadcrumb", "reasons"),
    [
        ("Check the Redis memory usage first.", None, ["content_match:redis memory"]),
        ("Redis is fine; memory is not.", None, []),  # both words, not the phrase
        ("Nothing relevant here.", "Runbooks > Redis Memory", ["breadcrumb_match:redis memory"]),
        ("Größe: the REDIS   memory limit", None, ["content_match:redis memory"]),  # non-ASCII text: split as before
        ("redismemory", None, []),  # substrings that are no words
    ],
)
def test_content_and_breadcrumb_matches(content: str, breadcrumb: str | None, reasons: list[str]):
    hints = L0Hints(matched_keywords=["Redis memory"])
    transform = QueryTransform(original_query="q", normalized_query="q", hints=hints, filter_reason="test")
    node = candidate_node(_candidate(content, breadcrumb))
    RuleReranker().postprocess_nodes([node], query_bundle=LookupQuery(query_str="q", transform=transform))
    record = stage_of(node).rerank
    assert record is not None
    found = [str(r) for r in record.hit_reasons if r.kind.value in ("content_match", "breadcrumb_match")]
    assert found == reasons
