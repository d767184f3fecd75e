"""Writing a file so that readers see the old one or the whole new one, never a part: a temporary file in the same
folder, flushed to disk (``fsync``), then renamed over the target (``os.replace``, atomic on one file system).

One helper for every file the project keeps (the L0 index, state snapshots, calibration, fixtures, ``serve.json``,
the ONNX exports and their weight notes), so each gets the same guarantees: nothing under the target's name until
the content is complete and on disk, and no temporary file left behind by an error.

A writer holds an exclusive ``flock`` on its temporary file until the rename, and :func:`remove_stale_temporaries`
(what a killed process left) removes a file only while holding that lock itself: two ingests saving the same L0
index at once each finish their own write. A writer whose new file was removed before it took the lock (the moment
between creating and locking it) sees that under the lock and makes another.

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
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

#: The suffix of every temporary file this module makes (``.<target name>.<random>.tmp``).
TEMP_SUFFIX = ".tmp"

#: How many times a writer makes a new temporary file when a clean-up removed the one it had just made.
_ATTEMPTS = 5


@contextlib.contextmanager
def atomic_path(target: str | Path, *, mode: int | None = None) -> Iterator[Path]:
    """A temporary path beside ``target`` for the caller (or a library it calls) to write; on a normal exit it is
    flushed to disk and renamed to ``target``, on an error removed.

    The temporary file exists (empty, owner-only) when the block starts. ``mode``: the permissions the target gets
    (``0o644`` for a cache other users read); by default the owner's only.
    """
    target = Path(target)
    fd, temp = _locked_temporary(target)
    try:
        yield temp
        _fsync(temp)
        if mode is not None:
            temp.chmod(mode)
        os.replace(temp, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            temp.unlink()
        os.close(fd)  # the lock goes with it


def _locked_temporary(target: Path) -> tuple[int, Path]:
    """A new temporary file beside ``target``, open and locked (``flock``, exclusive) by this process; unlocked on a
    file system that takes no ``flock`` (where :func:`remove_stale_temporaries` cannot lock it either, and so
    removes nothing)."""
    for _ in range(_ATTEMPTS):
        fd, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=TEMP_SUFFIX)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # waits while a clean-up holds it to remove it
        except OSError:
            return fd, Path(name)  # no locks here (ENOLCK): written as before, never removed as stale
        if _still_named(name, fd):
            return fd, Path(name)  # still ours: no clean-up can remove it while the lock is held
        os.close(fd)  # removed as stale between its making and the lock: make another
    raise OSError(f"could not keep a temporary file beside {target}: each was removed as it was made")


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


def remove_stale_temporaries(target: str | Path) -> list[Path]:
    """Remove the temporary files of ``target`` that a killed process left behind (an error never leaves one): those
    no writer holds, each removed while this process holds its lock (a writer that made it in that moment finds it
    gone and makes another). Another process's write in progress is never touched. The paths removed."""
    removed = []
    for temp in _temporaries(target):
        try:
            fd = os.open(temp, os.O_RDONLY)
        except OSError:
            continue  # renamed or removed meanwhile
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)  # a live writer's (or a file system without locks: nothing is known to be stale)
            continue
        try:
            if _still_named(temp, fd):
                temp.unlink(missing_ok=True)
                removed.append(temp)
        finally:
            os.close(fd)
    return removed


def _still_named(path: str | Path, fd: int) -> bool:
    """``path`` still names the file open as ``fd`` (not removed, nor replaced by another file)."""
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


def _temporaries(target: str | Path) -> list[Path]:
    target = Path(target)
    return sorted(target.parent.glob(f".{glob.escape(target.name)}.*{TEMP_SUFFIX}"))


def _fsync(path: Path) -> None:
    """The file's content on disk before the rename: after a crash the target is the old file or the new one.

    Opened by name, not through the lock's descriptor: a library given the path may have written a new file there.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
