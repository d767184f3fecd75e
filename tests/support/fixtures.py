"""Plain pytest fixtures over the test servers.

``tests/conftest.py`` makes them available to every test with
``pytest_plugins = ["tests.support.fixtures"]``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from . import postgres
from .milvus_server import MilvusServer


@pytest.fixture(scope="session")
def milvus_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MilvusServer]:
    """One real Milvus standalone server for the whole test session, stopped (whole process tree) at the end.

    Tests share it: give collections unique names and drop them. A test that stops or restarts a server
    starts its own ``MilvusServer`` instead.
    """
    server = MilvusServer(tmp_path_factory.mktemp("milvus-server"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def postgres_url() -> str:
    """The PostgreSQL URL from ``KB_TEST_POSTGRES_URL``; skips the test, saying so, when it is not set."""
    url = postgres.postgres_url()
    if url is None:
        pytest.skip(postgres.NOT_SET_MESSAGE)
    return url
