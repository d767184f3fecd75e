"""Writing a file so that readers see the old one or the whole new one, never a part: a temporary file in the same
folder, flushed to disk (``fsync``), then renamed over the target (``os.replace``, atomic on one file system).

One helper for every file the project keeps (the L0 index, state snapshots, calibration, fixtures, ``serve.json``,
the ONNX exports and their weight notes), so each gets the same guarantees: nothing under the target's name until
the content is complete and on disk, and no temporary file left behind by an error.

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
import glob
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

#: The suffix of every temporary file this module makes (``.<target name>.<random>.tmp``).
TEMP_SUFFIX = ".tmp"


@contextlib.contextmanager
def atomic_path(target: str | Path, *, mode: int | None = None) -> Iterator[Path]:
    """A temporary path beside ``target`` for the caller (or a library it calls) to write; on a normal exit it is
    flushed to disk and renamed to ``target``, on an error removed.

    The temporary file exists (empty, owner-only) when the block starts. ``mode``: the permissions the target gets
    (``0o644`` for a cache other users read); by default the owner's only.
    """
    target = Path(target)
    fd, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=TEMP_SUFFIX)
    os.close(fd)
    temp = Path(name)
    try:
        yield temp
        _fsync(temp)
        if mode is not None:
            temp.chmod(mode)
        os.replace(temp, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            temp.unlink()


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


def stale_temporaries(target: str | Path) -> list[Path]:
    """Temporary files of ``target`` that a killed process left behind (an error never leaves one)."""
    target = Path(target)
    return sorted(target.parent.glob(f".{glob.escape(target.name)}.*{TEMP_SUFFIX}"))


def _fsync(path: Path) -> None:
    """The file's content on disk before the rename: after a crash the target is the old file or the new one."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
