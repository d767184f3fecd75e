"""Writing a file so that readers see the old one or the whole new one, never a part: a temporary file in the same
folder, flushed to disk (``fsync``), then renamed over the target (``os.replace``, atomic on one file system).

One helper for every file the project keeps (the L0 index, state snapshots, calibration, fixtures, ``serve.json``,
the ONNX exports and their weight notes), so each gets the same guarantees: nothing under the target's name until
the content is complete and on disk, and no temporary file left behind by an error.

A writer holds an exclusive ``flock`` on its temporary file until the rename, so :func:`stale_temporaries` (what a
killed process left) never names another live process's file: two ingests saving the same L0 index at once each
finish their own write.

Example:
    >>> import pathlib, tempfile
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> with atomic_write(folder / "note.txt") as handle:
    ...     _ = handle.write("done")
    >>> (folder / "note.txt").read_text()
    'done'
    >>> sorted(p.name for p in folder.iterdir())  # no temporary file left
    ['note.txt']
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

#: The suffix of every temporary file this module makes (``.<target name>.<random>.tmp``).
TEMP_SUFFIX = ".tmp"

#: A temporary file younger than this (seconds) is never called stale: it may be one a writer has just made and not
#: yet locked (the lock follows ``mkstemp`` by microseconds).
STALE_AFTER_S = 60.0


@contextlib.contextmanager
def atomic_path(target: str | Path, *, mode: int | None = None) -> Iterator[Path]:
    """A temporary path beside ``target`` for the caller (or a library it calls) to write; on a normal exit it is
    flushed to disk and renamed to ``target``, on an error removed.

    The temporary file exists (empty, owner-only) when the block starts. ``mode``: the permissions the target gets
    (``0o644`` for a cache other users read); by default the owner's only.
    """
    target = Path(target)
    fd, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=TEMP_SUFFIX)
    temp = Path(name)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # held until the rename: this temporary file is live, not stale
        yield temp
        _fsync(temp)
        if mode is not None:
            temp.chmod(mode)
        os.replace(temp, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            temp.unlink()
        os.close(fd)


@contextlib.contextmanager
def atomic_write(
    target: str | Path,
    mode: str = "w",
    *,
    encoding: str = "utf-8",
    newline: str | None = None,
    file_mode: int | None = None,
) -> Iterator[IO[Any]]:
    """An open file whose content replaces ``target`` whole when the block ends without an error.

    ``mode``: ``"w"`` (text, ``encoding`` and ``newline`` as :func:`open`'s) or ``"wb"``; ``file_mode``: the
    target's permissions, as :func:`atomic_path`'s ``mode``.
    """
    with (
        atomic_path(target, mode=file_mode) as temp,
        open(temp, mode, encoding=None if "b" in mode else encoding, newline=newline) as handle,
    ):
        yield handle


def stale_temporaries(target: str | Path, *, older_than_s: float = STALE_AFTER_S) -> list[Path]:
    """Temporary files of ``target`` that a killed process left behind (an error never leaves one): no writer holds
    them and they are older than ``older_than_s`` seconds. Another process's write in progress is never among them.
    """
    target = Path(target)
    now = time.time()
    return [
        temp
        for temp in sorted(target.parent.glob(f".{glob.escape(target.name)}.*{TEMP_SUFFIX}"))
        if _unheld(temp) and _age_s(temp, now) >= older_than_s
    ]


def _fsync(path: Path) -> None:
    """The file's content on disk before the rename: after a crash the target is the old file or the new one.

    Opened by name, not through the lock's descriptor: a library given the path may have written a new file there.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _unheld(path: Path) -> bool:
    """No process holds the writer's lock on ``path`` (``False`` when it is held, or gone)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return True
    finally:
        os.close(fd)


def _age_s(path: Path, now: float) -> float:
    """Seconds since ``path`` was last written (0 when it is gone)."""
    try:
        return now - path.stat().st_mtime
    except OSError:
        return 0.0
