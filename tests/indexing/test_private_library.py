"""Issue 40 item 7: the state dir's files are the owner's only for a library or notebook caller too (not only for
the CLI, which sets its own umask): under umask 000, ``ingest()`` and ``KnowledgeLookup`` leave no file or folder
that grants group or others anything, and the caller's umask is as it was afterwards. Real Milvus Lite, real model.
"""

from __future__ import annotations

import os
import stat
import threading

import pytest

from kb_retrieval.config import KBSettings
from kb_retrieval.engine import KnowledgeLookup
from kb_retrieval.indexing.ingest import ingest
from kb_retrieval.indexing.lite_files import private_umask
from kb_retrieval.indexing.milvus import release_lite
from tests.conftest import SAMPLE_KB

pytestmark = pytest.mark.skipif(os.name != "posix", reason="POSIX file modes")


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_library_callers_get_private_state_files_under_umask_000(tmp_path, embed_model):
    old = os.umask(0)
    try:
        settings = KBSettings(state_dir=tmp_path / "state")
        ingest([SAMPLE_KB / "redis"], settings, embed_model=embed_model)
        assert _current_umask() == 0  # the caller's umask back after ingest
        lookup = KnowledgeLookup(settings, embed_model=embed_model)
        assert _current_umask() == 0
        assert lookup.lookup("Redis memory usage high").found
        lookup.close()
        release_lite(settings)
    finally:
        os.umask(old)
    created = [p for p in settings.storage.state_dir.rglob("*") if not p.is_symlink()]
    assert any(p.suffix == ".idx" for p in created) and any(p.name == "traces.db" for p in created)
    loose = [(str(p.relative_to(tmp_path)), oct(stat.S_IMODE(p.stat().st_mode))) for p in created]
    assert [entry for entry, p in zip(loose, created, strict=True) if p.stat().st_mode & 0o077] == []


def test_private_umask_is_reentrant_across_threads_and_restores_the_callers():
    old = os.umask(0o002)
    try:
        inside = threading.Event()
        leave = threading.Event()

        def other() -> None:
            with private_umask():
                inside.set()
                leave.wait(10)

        thread = threading.Thread(target=other)
        with private_umask():
            assert _current_umask() == 0o077
            thread.start()
            assert inside.wait(10)
        assert _current_umask() == 0o077  # the other thread's block still open
        leave.set()
        thread.join(10)
        assert _current_umask() == 0o002
    finally:
        os.umask(old)
