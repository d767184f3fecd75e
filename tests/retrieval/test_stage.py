"""Stage data on a node: read back as written (no second validation), and still right when a node was copied,
serialised or had its text replaced by another postprocessor; and the rule reranker's content and breadcrumb
matches, whose word splitting is skipped only when it cannot match."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
from llama_index.core.schema import NodeWithScore, TextNode
from pydantic import ValidationError

from kb_retrieval.models import Candidate, DocumentSection, L0Hints, QueryTransform, ScoreLabel
from kb_retrieval.retrieval import stage as stage_module
from kb_retrieval.retrieval.hybrid import LookupQuery
from kb_retrieval.retrieval.rerank import RuleReranker
from kb_retrieval.retrieval.stage import (
    STAGE_KEY,
    HitKind,
    RerankRecord,
    StageData,
    candidate_node,
    hit_reason,
    stage_from_json,
    stage_json,
    stage_of,
    write_stage,
)
from tests.support.candidates import cand

pytestmark = pytest.mark.unit


def test_stage_data_is_read_back_as_written_without_validating_again(monkeypatch):
    node = candidate_node(cand("a", "a.md", 0.5), lexical_score=0.75)
    first = stage_of(node)

    def no_validation(*args: object, **kwargs: object) -> StageData:
        raise AssertionError("validated again")

    monkeypatch.setattr(stage_module, "stage_from_json", no_validation)
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


def _full_stage() -> StageData:
    """Stage data with every field set, as the pipeline's stages leave it."""
    data = StageData(candidate=cand("a", "a.md", 0.5), lexical_score=0.25, exact_terms=["max_connections"], exact_df=2)
    data.rerank = RerankRecord(
        base_score=0.5,
        evidence_score=0.55,
        boosts={"lexical": 0.05},
        hit_reasons=[hit_reason(HitKind.L1_SEMANTIC, "0.500")],
        ranking={"chunk": 0.3, "doc_title": 0.2},
    )
    data.merged_chunks = 2
    data.sections.append(cand("b", "a.md", 0.4))
    data.document.append(
        DocumentSection(breadcrumb="A > B", content="text of a", position=0, matched=True, match_rank=0)
    )
    data.notes.append("DocumentRanker: no vectors")
    return data


def _candidate_json(chunk_id: str, similarity: float, **content: str) -> dict[str, object]:
    """A :func:`cand` candidate's JSON, field for field in order; ``content`` only where the JSON keeps it."""
    return {
        "chunk_id": chunk_id,
        "source": "a.md",
        "title": None,
        "breadcrumb": None,
        "category": None,
        **content,
        "keywords": [],
        "entities": [],
        "chunk_count": 4,
        "position": None,
        "score": similarity,
        "score_label": "cosine_similarity",
        "path": "sdk",
        "similarity": similarity,
        "doc_hash": None,
        "ingested_at": None,
    }


#: What ``metadata[STAGE_KEY]`` held for :func:`_full_stage` when the stage data were pydantic models (main 01f441d):
#: the JSON a LlamaIndex callback handler or a stock postprocessor sees, field for field, in this order.
_FULL_JSON = {
    "candidate": _candidate_json("a", 0.5),  # without its content: the node's text is the content
    "lexical_score": 0.25,
    "exact_terms": ["max_connections"],
    "exact_df": 2,
    "rerank": {
        "base_score": 0.5,
        "evidence_score": 0.55,
        "boosts": {"lexical": 0.05},
        "hit_reasons": [{"kind": "l1_semantic", "detail": "0.500"}],
        "ranking": {"chunk": 0.3, "doc_title": 0.2},
    },
    "merged_chunks": 2,
    "sections": [_candidate_json("b", 0.4, content="text of b")],
    "document": [
        {
            "breadcrumb": "A > B",
            "content": "text of a",
            "position": 0,
            "matched": True,
            "match_rank": 0,
            "hit_reasons": [],
        }
    ],
    "notes": ["DocumentRanker: no vectors"],
}


def test_the_stage_json_is_the_models_json_and_reads_back_equal():
    raw = stage_json(_full_stage())
    assert json.dumps(raw) == json.dumps(_FULL_JSON)  # same keys in the same order, same values
    assert stage_from_json(json.loads(json.dumps(raw)), "text of a") == _full_stage()


@pytest.mark.parametrize(
    ("change", "where"),
    [
        (lambda raw: raw.__setitem__("exact_df", "many"), ("exact_df",)),
        (lambda raw: raw["rerank"].pop("evidence_score"), ("rerank", "evidence_score")),
        (lambda raw: raw["rerank"]["hit_reasons"].append({"kind": "nope", "detail": "x"}), ("rerank", "hit_reasons")),
        (lambda raw: raw.__setitem__("sections", [1]), ("sections", 0)),
    ],
)
def test_bad_stage_json_raises_a_validation_error_naming_the_field(change, where):
    raw = json.loads(json.dumps(_FULL_JSON))
    change(raw)
    node = NodeWithScore(node=TextNode(id_="a", text="text of a", metadata={STAGE_KEY: raw}))
    with pytest.raises(ValidationError, match="validation error for StageData") as caught:
        stage_of(node)
    assert caught.value.errors()[0]["loc"][: len(where)] == where


def test_a_search_s_numpy_scalars_become_the_stage_data_s_types():
    terms = ["max_connections"]
    node = candidate_node(
        cand("a", "a.md", 0.5), lexical_score=np.float32(0.25), exact_terms=terms, exact_df=np.int64(2)
    )
    data = stage_of(node)
    assert type(data.lexical_score) is float and type(data.exact_df) is int
    assert data.exact_terms == terms and data.exact_terms is not terms  # its own list, as a validated model's
    assert node.node.metadata[STAGE_KEY]["exact_df"] == 2


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
