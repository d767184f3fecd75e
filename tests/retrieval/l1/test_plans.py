"""The L1 plan is chosen once, when the pipeline is built: one class per way a search runs, and a path's optional
features found once (no per-query branching on plan, lexical mode or path). Real Milvus Lite, the sample KB."""

from __future__ import annotations

from typing import Any

import pytest

from kb_retrieval.engine import KnowledgeLookup
from kb_retrieval.retrieval.l1.auto import AutoPath
from kb_retrieval.retrieval.l1.base import L1Search
from kb_retrieval.retrieval.l1.plans import DenseBm25Plan, FusedPlan, MirrorPlan
from kb_retrieval.retrieval.l1.retriever import PathFeatures
from kb_retrieval.retrieval.l1.sdk import SdkPath
from kb_retrieval.retrieval.l1.vectorstore import VectorStorePath
from kb_retrieval.retrieval.scope import FieldTest, Scope

#: A scope only Milvus evaluates (a metadata key), and one the mirror does (a field test).
SCOPE = Scope('metadata["team"] == "sre"')
FIELD_SCOPE = Scope('category == "redis"', (FieldTest("category", frozenset({"redis"})),))


@pytest.fixture()
def lookup_with(sample_settings, embed_model):
    built: list[KnowledgeLookup] = []

    def make(**settings: Any) -> KnowledgeLookup:
        built.append(KnowledgeLookup(sample_settings.model_copy(update=settings), embed_model=embed_model))
        return built[-1]

    yield make
    for lookup in built:
        lookup.close()


def test_the_memory_plan_serves_unscoped_searches_and_milvus_the_scopes_only_it_evaluates(lookup_with) -> None:
    hybrid = lookup_with(lookup_plan="memory").pipeline.hybrid
    assert hybrid.lexical_mode == "milvus_bm25"  # Lite 3.2: BM25 in the dense search's own call
    assert isinstance(hybrid.memory_plan, FusedPlan) and isinstance(hybrid.memory_plan.otherwise, MirrorPlan)
    assert isinstance(hybrid.milvus_plan, FusedPlan) and isinstance(hybrid.milvus_plan.otherwise, DenseBm25Plan)
    assert hybrid.plan_for(None) is hybrid.memory_plan
    assert hybrid.plan_for(SCOPE) is hybrid.milvus_plan  # a Milvus expression: only Milvus evaluates it
    assert hybrid.plan_for(FIELD_SCOPE) is hybrid.memory_plan  # a row mask over the mirror


def test_the_milvus_plan_has_no_memory_plan(lookup_with) -> None:
    hybrid = lookup_with(lookup_plan="milvus").pipeline.hybrid
    assert hybrid.memory_plan is None
    assert hybrid.plan_for(None) is hybrid.plan_for(SCOPE) is hybrid.plan_for(FIELD_SCOPE) is hybrid.milvus_plan


def test_bm25_off_searches_dense_only(lookup_with) -> None:
    hybrid = lookup_with(lookup_plan="memory", lexical_enabled=False).pipeline.hybrid
    assert hybrid.lexical_mode == "off"
    assert isinstance(hybrid.memory_plan, MirrorPlan) and hybrid.memory_plan.bm25 is None
    assert isinstance(hybrid.milvus_plan, DenseBm25Plan) and hybrid.milvus_plan.bm25 is None
    found = hybrid.search(hybrid.dense.embed_model.get_query_embedding("redis memory high"), "redis memory high")
    assert found.candidates and found.lexical_mode == "off" and found.lexical_count == 0


class SearchOnly:
    """A path with a dense search and nothing beside it (a caller's own vector store)."""

    name = "sdk"

    def search(self, embedding: list[float], top_k: int, filter_expr: str | None, timeout: float | None = None):
        return L1Search()


def test_path_features_are_found_once_and_typed(sample_settings, lookup_with) -> None:
    client = lookup_with().client
    sdk, store = SdkPath(client, sample_settings), VectorStorePath(sample_settings)
    assert PathFeatures.of(sdk) == PathFeatures(ids_only=sdk, fetch=sdk, hybrid=sdk, sends=sdk)
    assert PathFeatures.of(store) == PathFeatures(ids_only=None, fetch=store, hybrid=store, sends=None)
    auto = AutoPath(store, sdk)
    assert PathFeatures.of(auto) == PathFeatures(ids_only=None, fetch=auto, hybrid=auto, sends=None)
    assert PathFeatures.of(AutoPath(store, SearchOnly())).hybrid is None  # auto has what both of its paths have
    assert PathFeatures.of(SearchOnly()) == PathFeatures(ids_only=None, fetch=None, hybrid=None, sends=None)
