"""How ``kb-retrieval lookup`` finds the ``kb-retrieval serve`` that holds its state dir, with no flag.

``serve`` writes ``serve.json`` into its state dir once it listens (its URL, its PID, the collection, whether it
wants a token) and removes it when it stops. ``lookup`` answers through that server when the file names a process
that really serves this state dir: on Milvus Lite, the process holding the data dir's lock (the lock knows its
holder, so a file left behind by a killed server, or naming a PID the system has since given to another process, is
ignored); on a Milvus server, a live process serving the same collection of the same URI. Standard library only: a
lookup through a server loads no pipeline.

Example:
    >>> find_server(KBSettings(state_dir=".kb-state"))  # doctest: +SKIP
    'http://127.0.0.1:8765'
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from kb_retrieval.atomic import atomic_write
from kb_retrieval.config import KBSettings
from kb_retrieval.indexing.lite_lock import lite_lock_holder

#: The file a running ``serve`` keeps in its state dir.
SERVE_FILE = "serve.json"


@dataclass(frozen=True)
class RunningServer:
    """A ``serve`` process found holding a state dir."""

    url: str
    pid: int
    token_required: bool


def serve_file(settings: KBSettings) -> Path:
    """The file a running ``serve`` keeps in the state dir (:data:`SERVE_FILE`), saying where it listens."""
    return Path(settings.storage.state_dir) / SERVE_FILE


def _served_uri(settings: KBSettings) -> str:
    return settings.mask(settings.resolved_milvus_uri())  # the file never holds a password


def announce(settings: KBSettings, url: str, *, token_required: bool) -> Path:
    """Write this process's ``serve.json`` (atomically, owner-only): ``url`` answers lookups on this state dir."""
    path = serve_file(settings)
    record = {
        "url": url,
        "pid": os.getpid(),
        "collection": settings.storage.collection,
        "milvus": _served_uri(settings),
        "token_required": token_required,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(path) as handle:  # owner-only (0600)
        json.dump(record, handle, sort_keys=True)
    return path


def withdraw(settings: KBSettings) -> None:
    """Remove ``serve.json`` if it is this process's (a server started since on the same dir keeps its own)."""
    path = serve_file(settings)
    found = _read(path)
    if found is not None and found.get("pid") == os.getpid():
        with contextlib.suppress(OSError):
            path.unlink()


def find_server(settings: KBSettings) -> RunningServer | None:
    """The ``serve`` process holding this state dir's collection, or ``None`` (then look up in process)."""
    record = _read(serve_file(settings))
    if record is None:
        return None
    url, pid = record.get("url"), record.get("pid")
    if not isinstance(url, str) or not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return None
    if record.get("collection") != settings.storage.collection:
        return None
    if settings.is_milvus_server():
        serves = record.get("milvus") == _served_uri(settings) and _alive(pid)
    else:
        holder = lite_lock_holder(Path(settings.resolved_milvus_uri()))
        serves = holder == pid or (holder == 0 and _alive(pid))  # 0: the system does not say who holds it
    return RunningServer(url, pid, bool(record.get("token_required"))) if serves else None


def _read(path: Path) -> dict[str, object] | None:
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True
