"""The PostgreSQL server the tests may use, given by URL in ``KB_TEST_POSTGRES_URL``.

``.ci/run`` starts a throw-away PostgreSQL server and exports the URL; on a developer's machine, export it by
hand to run the PostgreSQL tests, or leave it unset and they are skipped with :data:`NOT_SET_MESSAGE`.
"""

from __future__ import annotations

import os

ENV_VAR = "KB_TEST_POSTGRES_URL"

NOT_SET_MESSAGE = (
    f"{ENV_VAR} is not set, so the PostgreSQL tests are skipped. Set it to a SQLAlchemy URL of a server "
    f"you can write to, e.g. {ENV_VAR}=postgresql+psycopg://kb:secret@127.0.0.1:5432/kb_test "
    "(.ci/run starts such a server and sets it)."
)

_DRIVERLESS_PREFIXES = ("postgresql://", "postgres://")


def postgres_url() -> str | None:
    """The URL from ``KB_TEST_POSTGRES_URL`` in SQLAlchemy's psycopg 3 form, or None when unset or blank.

    A plain ``postgresql://`` (or ``postgres://``) URL is given the ``+psycopg`` driver: SQLAlchemy's default
    for it is psycopg2, which the project does not install.
    """
    url = os.environ.get(ENV_VAR, "").strip()
    if not url:
        return None
    for prefix in _DRIVERLESS_PREFIXES:
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url
