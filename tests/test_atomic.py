"""The atomic write: the target is the old file or the whole new one, the new one is on disk before the rename, and
no temporary file outlives the write."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from kb_retrieval import atomic
from kb_retrieval.atomic import atomic_path, atomic_write, remove_stale_temporaries


def _names(folder) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_atomic_write_replaces_the_target_whole(tmp_path) -> None:
    target = tmp_path / "record.json"
    target.write_text("old", encoding="utf-8")
    with atomic_write(target) as handle:
        handle.write("new ")
        assert target.read_text(encoding="utf-8") == "old"  # nothing under the name until the block ends
        handle.write("content")
    assert target.read_text(encoding="utf-8") == "new content"
    assert _names(tmp_path) == ["record.json"]


def test_an_error_keeps_the_old_file_and_leaves_no_temporary(tmp_path) -> None:
    target = tmp_path / "record.json"
    target.write_text("old", encoding="utf-8")
    with pytest.raises(RuntimeError), atomic_write(target) as handle:
        handle.write("half")
        raise RuntimeError("interrupted")
    assert target.read_text(encoding="utf-8") == "old"
    assert _names(tmp_path) == ["record.json"]


def test_binary_text_and_newline(tmp_path) -> None:
    with atomic_write(tmp_path / "a.bin", "wb") as handle:
        handle.write(b"\x00\x01")
        handle.seek(0)
        handle.write(b"\x02")  # rewritten in place before the rename, as a snapshot's header is
    assert (tmp_path / "a.bin").read_bytes() == b"\x02\x01"
    with atomic_write(tmp_path / "a.txt", newline="\n") as handle:
        handle.write("é\n")
    assert (tmp_path / "a.txt").read_bytes() == "é\n".encode()


def test_permissions_owner_only_unless_asked(tmp_path) -> None:
    with atomic_write(tmp_path / "private") as handle:
        handle.write("x")
    with atomic_write(tmp_path / "shared", file_mode=0o644) as handle:
        handle.write("x")
    assert stat.S_IMODE((tmp_path / "private").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "shared").stat().st_mode) == 0o644


def test_atomic_path_is_for_a_writer_that_takes_a_path(tmp_path) -> None:
    target = tmp_path / "model.onnx"
    with atomic_path(target, mode=0o644) as temp:
        assert temp.parent == tmp_path and temp.exists() and not target.exists()
        temp.write_bytes(b"graph")
    assert target.read_bytes() == b"graph"
    assert _names(tmp_path) == ["model.onnx"]


def test_the_content_is_synced_before_the_rename(tmp_path, monkeypatch) -> None:
    events: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(atomic.os, "fsync", lambda fd: (events.append("fsync"), real_fsync(fd))[1])
    monkeypatch.setattr(atomic.os, "replace", lambda a, b: (events.append("replace"), real_replace(a, b))[1])
    with atomic_write(tmp_path / "f") as handle:
        handle.write("x")
    assert events == ["fsync", "replace"]


def _writer(target) -> subprocess.Popen:
    """Another process that starts an atomic write of ``target``, says ``ready`` and waits on its stdin mid-write
    (the caller lets it finish, or kills it)."""
    code = (
        "import sys; from kb_retrieval.atomic import atomic_write\n"
        "with atomic_write(sys.argv[1]) as handle:\n"
        "    handle.write('partial'); handle.flush(); print('ready', flush=True); sys.stdin.readline()\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(target)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def test_removing_stale_temporaries_takes_what_a_killed_writer_left(tmp_path) -> None:
    target = tmp_path / "index[1].json"  # glob characters in the name are matched literally
    proc = _writer(target)
    proc.kill()
    proc.wait()
    (temp,) = tmp_path.glob(".index[[]1].json.*.tmp")
    (tmp_path / "other.json").write_text("{}", encoding="utf-8")
    assert remove_stale_temporaries(tmp_path / "other.json") == []
    assert remove_stale_temporaries(target) == [temp]
    assert _names(tmp_path) == ["other.json"]


def test_a_live_writers_temporary_is_never_removed(tmp_path) -> None:
    """Two ingests save one L0 index at the same moment: one must not remove the other's file mid-write."""
    target = tmp_path / "index.json"
    proc = _writer(target)
    try:
        assert remove_stale_temporaries(target) == []
        with atomic_write(target) as handle:  # this process's own write meanwhile
            handle.write("mine")
            assert remove_stale_temporaries(target) == []
    finally:
        assert proc.stdin is not None
        proc.stdin.write("\n")
        proc.stdin.close()
        assert proc.wait(timeout=60) == 0
    assert target.read_text(encoding="utf-8") == "partial"  # the other writer finished its own write
    assert _names(tmp_path) == ["index.json"]


def test_a_temporary_removed_before_its_writer_locked_it_is_made_again(tmp_path, monkeypatch) -> None:
    """The moment between making a temporary file and locking it: a clean-up then removes it as stale; the writer
    sees that under its lock and writes through a new one."""
    made: list[str] = []
    real_mkstemp = atomic.tempfile.mkstemp

    def made_then_cleaned(**kwargs):
        fd, name = real_mkstemp(**kwargs)
        made.append(name)
        if len(made) == 1:
            assert remove_stale_temporaries(tmp_path / "index.json") == [Path(name)]
        return fd, name

    monkeypatch.setattr(atomic.tempfile, "mkstemp", made_then_cleaned)
    with atomic_write(tmp_path / "index.json") as handle:
        handle.write("whole")
    assert len(made) == 2
    assert (tmp_path / "index.json").read_text(encoding="utf-8") == "whole"
    assert _names(tmp_path) == ["index.json"]


def test_a_file_system_without_locks_writes_as_before_and_removes_nothing(tmp_path, monkeypatch) -> None:
    """Where ``flock`` fails (ENOLCK: some network file systems), a write still completes, and no temporary file is
    taken for stale, since none can be known to be."""
    import errno

    def no_locks(fd, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    leftover = tmp_path / ".index.json.left.tmp"
    leftover.write_text("killed", encoding="utf-8")
    monkeypatch.setattr(atomic.fcntl, "flock", no_locks)
    with atomic_write(tmp_path / "index.json") as handle:
        handle.write("whole")
    assert (tmp_path / "index.json").read_text(encoding="utf-8") == "whole"
    assert remove_stale_temporaries(tmp_path / "index.json") == []
    assert _names(tmp_path) == [".index.json.left.tmp", "index.json"]
