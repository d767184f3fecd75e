"""Shared fixtures: the real embedding model (loaded once), the bundled sample KB ingested into Milvus Lite.

Where a test goes (the tests mirror the package; the project-wide checks at the top) is said in ``tests/__init__.py``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"
SAMPLE_KB = REPO / "kb_retrieval" / "sample_kb"

pytest_plugins = ["tests.support.fixtures"]

#: Fixtures that bring the model, Milvus or a database server: a test marked ``unit`` (``make unit``) uses none.
HEAVY_FIXTURES = frozenset(
    {
        "embed_model",
        "sample_settings",
        "sample_lookup",
        "runbooks_lookup",
        "milvus_server",
        "milvus_backend",
        "known_kb",
        "server_sample_settings",
        "postgres_url",
        "postgres_schema_url",
        "trace_url",
    }
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep the ``unit`` marker honest: pure logic only, so ``make unit`` stays under a minute."""
    for item in items:
        heavy = HEAVY_FIXTURES & set(getattr(item, "fixturenames", ()))
        if heavy and item.get_closest_marker("unit"):
            raise pytest.UsageError(f"{item.nodeid} is marked unit but uses {', '.join(sorted(heavy))}")


@pytest.fixture(scope="session")
def embed_model():
    from kb_retrieval.indexing.embeddings import load_embed_model

    return load_embed_model()


@pytest.fixture(scope="session")
def sample_settings(tmp_path_factory: pytest.TempPathFactory, embed_model):
    """KBSettings of a state dir holding the sample KB, ingested once per session (Milvus Lite, COSINE)."""
    from kb_retrieval.config import KBSettings
    from kb_retrieval.indexing.ingest import ingest

    settings = KBSettings(state_dir=tmp_path_factory.mktemp("sample-state"), vector_store_mode="sdk")
    ingest([SAMPLE_KB], settings, embed_model=embed_model)
    return settings


@pytest.fixture(scope="session")
def runbooks_lookup(tmp_path_factory: pytest.TempPathFactory, embed_model) -> Iterator[object]:
    """A lookup over the shared runbooks corpus (../shared/corpora/runbooks), ingested once per session."""
    from kb_retrieval.config import KBSettings
    from kb_retrieval.engine import KnowledgeLookup
    from kb_retrieval.indexing.ingest import ingest

    corpus = SHARED / "corpora" / "runbooks"
    if not corpus.is_dir():
        pytest.fail(f"the shared runbooks corpus is missing at {corpus} (../shared beside the repository)")
    settings = KBSettings(state_dir=tmp_path_factory.mktemp("runbooks-state"), vector_store_mode="sdk")
    ingest([corpus], settings, embed_model=embed_model)
    lookup = KnowledgeLookup(settings)  # queries through the ONNX export, as the CLI's
    yield lookup
    lookup.close()


@pytest.fixture(scope="session")
def sample_lookup(sample_settings, embed_model) -> Iterator[object]:
    from kb_retrieval.engine import KnowledgeLookup

    # No model given: queries go through the ONNX export, as the CLI's do (the committed fixtures' encoder).
    lookup = KnowledgeLookup(sample_settings)
    yield lookup
    lookup.close()
