"""Connecting to Milvus: a Milvus Lite data dir opened in this process (private files, a held dir or a full
disk said in one line) or a server checked reachable first; the gRPC keepalive policy Lite needs; releasing a
Lite dir for another process; Milvus errors told to a person."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import socket
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from pymilvus import MilvusClient, MilvusException

from kb_retrieval.config import KBSettings
from kb_retrieval.indexing.lite_files import check_lite_files
from kb_retrieval.indexing.lite_lock import lite_lock_holder

#: Milvus Lite serves gRPC from this process with grpc's default policy: at most one client ping every 5 minutes.
#: pymilvus pings every 10 s, calls or not, so an idle client was sent away ("too_many_pings") after about 30 s and
#: its reconnect could fail ("Fail connecting to server"), failing lookups and new clients alike. Lite clients ping
#: only during calls, and at most every 10 minutes.
LITE_GRPC_OPTIONS = {"grpc.keepalive_time_ms": 600_000, "grpc.keepalive_permit_without_calls": False}


def client_options(settings: KBSettings) -> dict[str, Any]:
    """Extra ``MilvusClient`` arguments for the configured URI (the gRPC keepalive policy for Milvus Lite)."""
    return {} if settings.is_milvus_server() else {"grpc_options": dict(LITE_GRPC_OPTIONS)}


class _UnimplementedRpcFilter(logging.Filter):
    """Drops the gRPC server's traceback for an RPC Milvus Lite does not implement (nothing else)."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return not (isinstance(error, NotImplementedError) and "Method not implemented" in str(error))


_UNIMPLEMENTED_RPC_FILTER = _UnimplementedRpcFilter()


def quiet_lite_unimplemented_rpcs() -> None:
    """Keep Milvus Lite's "Method not implemented!" tracebacks out of the user's terminal.

    Milvus Lite serves gRPC from this process and lacks some RPCs (``AllocTimestamp``): pymilvus calls it while
    creating an index (the first ingest) and in query iterators, falls back correctly, but grpc logs a traceback
    at ERROR for each call. Only those records are dropped; other gRPC server errors still show.
    """
    logger = logging.getLogger("grpc._server")
    if _UNIMPLEMENTED_RPC_FILTER not in logger.filters:
        logger.addFilter(_UNIMPLEMENTED_RPC_FILTER)


class MilvusUnavailableError(ConnectionError):
    """The Milvus URI cannot be reached."""


class MilvusLiteLockedError(MilvusUnavailableError):
    """Another process holds the Milvus Lite data dir: Lite opens a data dir in one process only.

    The message is one line naming the dir, the holder's PID when the system tells it, and the ways out.
    """


def lite_locked_message(data_dir: Path, pid: int) -> str:
    """One line: which dir is held, by whom, and the ways out (a Lite server shared by local processes, a server)."""
    holder = f"process {pid}" if pid else "another process"
    return (
        f"Milvus Lite data dir {data_dir} is held by {holder} (Milvus Lite opens a data dir in one process only): "
        f"stop that process; if it is `kb-retrieval serve`, look up through it with `kb-retrieval lookup --server URL` "
        f"(or KB_SERVER_URL=URL); or serve the dir once for every local process with `milvus-lite server --data-dir "
        f"{data_dir} --host 127.0.0.1 --port 19530` (after stopping it) and set KB_MILVUS_URI=http://127.0.0.1:19530, "
        f"or point KB_MILVUS_URI at a Milvus server"
    )


class _LiteLockedFilter(logging.Filter):
    """Drops milvus-lite's traceback for a data dir another process holds, or one it cannot write (read-only, full
    disk, permissions): ``connect`` raises one clear line for each."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return type(error).__name__ != "DataDirLockedError" and not isinstance(error, OSError)


_LITE_LOCKED_FILTER = _LiteLockedFilter()


def connect(settings: KBSettings) -> MilvusClient:
    """A client for the configured URI: a Milvus Lite file (created on demand) or a reachable server."""
    uri = settings.resolved_milvus_uri()
    if settings.is_milvus_server():
        _check_reachable(uri, settings.storage.milvus_timeout_s, settings)
        token = settings.storage.milvus_token.get_secret_value()
        try:
            options = _served_lite_options(uri, token, settings.storage.milvus_timeout_s)
            return MilvusClient(uri=uri, token=token, timeout=settings.storage.milvus_timeout_s, **options)
        except Exception as exc:  # the message names the URI: its password and the token are masked
            raise MilvusUnavailableError(settings.mask(f"cannot connect to Milvus at {uri}: {exc}")) from None
    private_dirs(Path(uri))  # its files hold the knowledge base's text: the owner's only, whatever the umask
    check_lite_files(Path(uri))  # a damaged index file removed (Lite rebuilds it), a damaged segment named
    quiet_lite_unimplemented_rpcs()
    client = _open_lite(uri, settings)
    private_files(Path(uri))
    return client


def private_dirs(data_dir: Path) -> None:
    """Create ``data_dir`` and its missing parents 0700 (a folder that exists keeps its mode: its owner's choice).

    Milvus Lite writes its files with the process umask (0644 under 022); a 0700 folder keeps them from others.
    """
    missing = []
    for folder in (data_dir, *data_dir.parents):
        if folder.exists():
            break
        missing.append(folder)
    for folder in reversed(missing):
        with contextlib.suppress(FileExistsError):
            folder.mkdir(mode=0o700)
            os.chmod(folder, 0o700)  # mkdir's mode is masked by the umask


def private_files(data_dir: Path) -> None:
    """Make the files Milvus Lite created under ``data_dir`` 0600 (best effort: a file it replaces later is again
    under the umask, inside the 0700 folder)."""
    if not data_dir.is_dir():
        return
    for path in data_dir.rglob("*"):
        with contextlib.suppress(OSError):
            if path.is_file() and not path.is_symlink() and path.stat().st_mode & 0o077:
                os.chmod(path, 0o600)


def _served_lite_options(uri: str, token: str, timeout_s: float) -> dict[str, Any]:
    """The Lite keepalive policy when ``uri`` is a ``milvus-lite server`` (same gRPC server, same ping limit).

    Asked on a connection of its own: pymilvus shares one connection per address, made with the first options.
    """
    probe = MilvusClient(uri=uri, token=token, timeout=timeout_s, dedicated=True)
    try:
        lite = is_lite_version(probe.get_server_version())
    finally:
        probe.close()
    return {"grpc_options": dict(LITE_GRPC_OPTIONS)} if lite else {}


def is_lite_version(version: str) -> bool:
    """True for the version string Milvus Lite reports (``milvus_lite-3.2.2``; a Milvus server says ``v2.3.5``)."""
    return str(version).lower().startswith("milvus_lite")


def is_lite_engine(client: MilvusClient, settings: KBSettings) -> bool:
    """True when the engine behind ``client`` is Milvus Lite: a local data dir, or a ``milvus-lite server`` URI.

    Lite wants a FLAT index and a flush after writes; a Milvus server indexes and flushes on its own.
    """
    if not settings.is_milvus_server():
        return True
    try:
        return is_lite_version(client.get_server_version())
    except MilvusException:
        return False


def _open_lite(uri: str, settings: KBSettings) -> MilvusClient:
    """Open (or reuse, in this process) the Milvus Lite data dir; one clear line when another process holds it."""
    logger = logging.getLogger("milvus_lite.server_manager")
    if _LITE_LOCKED_FILTER not in logger.filters:
        logger.addFilter(_LITE_LOCKED_FILTER)
    try:
        return MilvusClient(uri=uri, **client_options(settings))
    except Exception as exc:
        data_dir = Path(uri).resolve()
        pid = lite_lock_holder(data_dir)
        if pid is not None:
            raise MilvusLiteLockedError(lite_locked_message(data_dir, pid)) from None
        if (why := _unwritable(data_dir)) is not None:
            raise MilvusUnavailableError(
                f"cannot open Milvus Lite data dir {data_dir}: {why} (Milvus Lite writes a lock file and its index "
                "files there: the state dir must be writable and have free space)"
            ) from None
        raise MilvusUnavailableError(f"cannot open Milvus Lite data dir {data_dir}: {exc}") from exc


#: How a write that ran out of space reads in Milvus Lite's errors (numpy's ``tofile``, Python's ``write``).
_DISK_FULL = re.compile(r"\d+ requested and \d+ written|No space left on device|Disk quota exceeded", re.IGNORECASE)


def describe_milvus_error(exc: Exception) -> str:
    """A Milvus error as one line for a person: its message, and what to do when it is a full disk.

    Example:
        >>> describe_milvus_error(MilvusException(1, "20352 requested and 9184 written"))
        'Milvus: 20352 requested and 9184 written (the disk ran out of space while Milvus wrote a file: free space \
and run the command again; a file it left cut short is repaired or named at the next start)'
    """
    message = str(getattr(exc, "message", "") or exc).strip().splitlines()
    line = message[0][:500] if message else type(exc).__name__
    if _DISK_FULL.search(line):
        line += (
            " (the disk ran out of space while Milvus wrote a file: free space and run the command again; a file it "
            "left cut short is repaired or named at the next start)"
        )
    return f"Milvus: {line}"


def _unwritable(data_dir: Path) -> str | None:
    """Why this process cannot write in ``data_dir`` (read-only file system, permissions, full disk), or None."""
    probe = data_dir / f".kb-write-check-{os.getpid()}"
    try:
        with probe.open("wb") as handle:
            handle.write(b"x")
            handle.flush()
            os.fsync(handle.fileno())
    except OSError as exc:
        return f"{exc.strerror or exc}: {exc.filename or probe}"
    finally:
        with contextlib.suppress(OSError):
            probe.unlink()
    return None


def release_lite(settings: KBSettings) -> None:
    """Close this process's Milvus Lite server of ``settings``: Lite opens a data dir in one process only, so this
    lets another process (a subprocess, ``kb-retrieval serve``) open it. Clients of it in this process stop working.
    Nothing to do for a Milvus server."""
    if settings.is_milvus_server():
        return
    from milvus_lite.server_manager import server_manager_instance

    from kb_retrieval.indexing.lite_files import private_umask

    with private_umask():  # Lite writes as it closes the dir (manifests, index files): the owner's only
        server_manager_instance.release_server(settings.resolved_milvus_uri())


def _check_reachable(uri: str, timeout_s: float, settings: KBSettings) -> None:
    """Fail within the timeout, with the URI (password masked) in the message, when nothing listens at host:port."""
    parsed = urlparse(uri)
    host = parsed.hostname or "localhost"
    port = parsed.port or (443 if parsed.scheme == "https" else 19530)
    try:
        with socket.create_connection((host, port), timeout=min(timeout_s, 5.0)):
            pass
    except OSError as exc:
        raise MilvusUnavailableError(
            settings.mask(f"Milvus server unreachable at {uri}: {exc.strerror or exc}")
        ) from exc
