"""The query engine (kb_retrieval/query_engine.py) and ``KnowledgeLookup.as_query_engine`` like BaseIndex's: with an
LLM (given, or ``Settings.llm`` as the fallback) it answers through it; without one it is the evidence, LLM-free, and
refuses what it cannot honour."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from llama_index.core import Settings
from llama_index.core.llms.mock import MockLLM
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.core.response_synthesizers import TreeSummarize

from kb_retrieval.query_engine import KnowledgeQueryEngine
from kb_retrieval.result import agent_text
from tests.support.kb import ALERT

# --- as_query_engine ----------------------------------------------------------------------------------------


def test_query_engine_with_an_llm_answers_through_it(sample_lookup):
    engine = sample_lookup.as_query_engine(
        llm=MockLLM(max_tokens=8), response_mode="tree_summarize", similarity_top_k=2
    )
    assert isinstance(engine, RetrieverQueryEngine)
    assert isinstance(engine._response_synthesizer, TreeSummarize)  # response_mode kept
    response = engine.query(ALERT)
    assert str(response).split() == ["text"] * 8  # MockLLM's answer, not the evidence text
    assert [n.node.node_id for n in response.source_nodes][:1] == ["redis/memory-usage-high.md"]
    assert len(response.source_nodes) == 2  # similarity_top_k kept


def test_query_engine_without_an_llm_is_the_evidence_and_refuses_what_it_cannot_honour(sample_lookup):
    engine = sample_lookup.as_query_engine(similarity_top_k=1)
    assert isinstance(engine, KnowledgeQueryEngine)
    response = engine.query(ALERT)
    assert str(response) == agent_text(engine.lookup.lookup(ALERT))  # the evidence text, as lookup_knowledge's
    assert [n.node.node_id for n in response.source_nodes] == ["redis/memory-usage-high.md"]
    assert json.loads(engine.model_dump_json())  # configuration only: the lookup is not serialised
    with pytest.raises(TypeError, match="unexpected argument\\(s\\) top_kk"):
        sample_lookup.as_query_engine(llm=MockLLM(), top_kk=2)
    with pytest.raises(ValueError, match="response_mode: answer synthesis needs llm"):
        sample_lookup.as_query_engine(response_mode="compact")


# --- Settings.llm as the fallback ----------------------------------------------------------------------------


@pytest.fixture
def configured_llm() -> Iterator[MockLLM]:
    llm = MockLLM(max_tokens=5)
    Settings.llm = llm
    try:
        yield llm
    finally:
        Settings._llm = None  # unset (assigning None to Settings.llm sets a MockLLM)


def test_as_query_engine_uses_settings_llm_when_one_is_set(sample_lookup, configured_llm) -> None:
    engine = sample_lookup.as_query_engine(similarity_top_k=1)
    assert isinstance(engine, RetrieverQueryEngine) and engine._response_synthesizer._llm is configured_llm
    response = engine.query(ALERT)
    assert str(response).split() == ["text"] * 5  # the LLM's answer
    assert [n.node.node_id for n in response.source_nodes] == ["redis/memory-usage-high.md"]


def test_as_query_engine_stays_llm_free_when_none_is_set(sample_lookup) -> None:
    assert Settings._llm is None
    assert isinstance(sample_lookup.as_query_engine(), KnowledgeQueryEngine)
