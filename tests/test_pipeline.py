"""A pipeline is built once from ``(settings, state)`` and never changed: a reload builds a new state and a new
pipeline, the old one (which a lookup in flight may still run through) stays exactly as it was. Real Milvus Lite, the
real model."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from typing import Any

import pytest

from kb_retrieval.config import KBSettings
from kb_retrieval.engine import KnowledgeLookup
from kb_retrieval.indexing.ingest import ingest
from kb_retrieval.pipeline import Pipeline
from tests.conftest import SAMPLE_KB
from tests.support.kb import LATER_DOC, ingested, write_kb

QUERIES = ("RedisMemoryHigh on redis-cache-01", "ZorkQuuxSpindleJammed on frobnicator-7", "mysql replication lag")


def _stages(pipeline: Pipeline) -> list[Any]:
    """Every built stage of ``pipeline``: the retrievers, the postprocessors, the attempt runner, and the state."""
    return [pipeline.dense, pipeline.hybrid, *pipeline.postprocessors, pipeline.attempts, pipeline.state]


def _attributes(stage: Any) -> dict[str, int]:
    """What each attribute of ``stage`` (public, private and pydantic-private) holds, by object identity."""
    values = dict(vars(stage)) if hasattr(stage, "__dict__") else {}
    values |= getattr(stage, "__pydantic_private__", None) or {}
    return {name: id(value) for name, value in values.items()}


def _walk(pipeline: Pipeline) -> list[tuple[int, dict[str, int]]]:
    return [(id(stage), _attributes(stage)) for stage in _stages(pipeline)]


@pytest.fixture()
def growing(tmp_path: Path, embed_model) -> tuple[KnowledgeLookup, Path, KBSettings]:
    kb = tmp_path / "kb"
    shutil.copytree(SAMPLE_KB / "redis", kb / "redis")
    settings = ingested([kb], tmp_path / "state", embed_model, freshness_check_s=3600)
    return KnowledgeLookup(settings, embed_model=embed_model), kb, settings


def test_no_stage_is_assigned_after_build_and_a_reload_builds_a_new_pipeline(growing, embed_model) -> None:
    lookup, kb, settings = growing
    wide = lookup.with_settings(top_k=30)
    old, old_wide = lookup.pipeline, wide.pipeline
    walked = _walk(old)
    for query in QUERIES:
        lookup.lookup(query)
        wide.lookup(query)
    assert lookup.pipeline is old and _walk(old) == walked  # lookups read the pipeline, never write into it

    write_kb(kb, LATER_DOC)
    ingest([kb], settings, embed_model=embed_model)
    assert lookup.refresh(force=True)

    new = lookup.pipeline
    assert new is not old and new.state is not old.state
    assert new.state.index_version != old.state.index_version
    assert _walk(old) == walked  # the old pipeline, stage by stage, attribute by attribute, as it was built
    assert not {id(s) for s in _stages(new)} & {id(s) for s in _stages(old)}  # every stage built anew
    # One state for every settings variant, one freshness check: the variant's next pipeline is over it too.
    assert wide.pipeline is not old_wide and wide.pipeline.state is new.state
    assert "ZorkQuuxSpindleJammed" in lookup.lookup(QUERIES[1]).query_transform.hints.matched_keywords
    assert "ZorkQuuxSpindleJammed" not in old.state.l0.hints(QUERIES[1]).matched_keywords
    lookup.close()


def test_the_pipeline_and_its_state_refuse_assignment(sample_lookup) -> None:
    pipeline = sample_lookup.pipeline
    with pytest.raises(dataclasses.FrozenInstanceError):
        pipeline.hybrid = pipeline.hybrid  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        pipeline.state.l0 = pipeline.state.l0  # type: ignore[misc]
    with pytest.raises(AttributeError):
        sample_lookup.l0 = pipeline.state.l0  # read-only: a state is replaced whole, through its holder


def test_postprocessors_come_from_their_factories(sample_lookup) -> None:
    """The pipeline's postprocessors are what their ``from_lookup`` builds from the lookup: same configuration, same
    state (the engine assembles none by hand)."""
    built = sample_lookup.pipeline.postprocessors
    for stage in built:
        again = type(stage).from_lookup(sample_lookup)
        assert again.to_dict() == stage.to_dict()
        assert (getattr(again, "__pydantic_private__", None) or {}).keys() == (
            getattr(stage, "__pydantic_private__", None) or {}
        ).keys()
        for name, value in (getattr(stage, "__pydantic_private__", None) or {}).items():
            assert getattr(again, name) is value or getattr(again, name) == value, (type(stage).__name__, name)
