"""Milvus Lite's files checked before they are opened: what can be rebuilt is removed, what cannot is named.

Milvus Lite writes an index file beside each data segment the first time a collection is loaded, and it writes it in
place, not atomically: a full disk (or a kill) leaves a file cut short, and from then on every load fails deep in
numpy or pyarrow (``Failed to read all data for array``, ``file seems not fully written?``) without naming the file,
and an ingest does not repair it. Those index files are derived data (Lite rebuilds a missing one from its segment
on the next load), so a damaged one is deleted here with a warning and Lite writes it again. A data segment
(``*.parquet``) its collection's manifest names, or the manifest itself, is the data: a damaged or missing one is
named in a one-line :class:`LiteDataError` with the fix (the knowledge base is re-ingested from its Markdown files).
A segment no manifest names is left to Lite, which deletes it on open: a kill mid-flush leaves one, cut short,
before the manifest naming it was written, and the next ingest writes those rows again.

The checks read headers and footers only (a few bytes per file), except the JSON sparse indexes, which are parsed.

Example:
    >>> check_lite_files(Path(".kb-state/milvus.db"))  # doctest: +SKIP
    []
"""

from __future__ import annotations

import ast
import contextlib
import json
import logging
import os
import struct
import threading
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger(__name__)

#: What Lite writes per segment: ``<data stem>.<field>.<index type>.idx`` (vector) or ``.sidx`` (scalar).
INDEX_SUFFIXES = (".idx", ".sidx")
_NPY_MAGIC = b"\x93NUMPY"
_ARROW_MAGIC = b"ARROW1"
_PARQUET_MAGIC = b"PAR1"


class LiteDataError(RuntimeError):
    """A Milvus Lite data file or manifest is damaged: the data cannot be read back (one line, with the fix)."""


def check_lite_files(data_dir: Path) -> list[Path]:
    """Check the Lite data dir ``data_dir`` before it is opened: damaged index files are deleted (Lite rebuilds them
    on the next load; each logged as a warning) and returned; a damaged data segment or manifest raises
    :class:`LiteDataError` naming it. Nothing to check in a data dir that does not exist yet."""
    collections = data_dir / "collections"
    if not collections.is_dir():
        return []
    removed = []
    for path in sorted(collections.glob("*/partitions/*/indexes/*")):
        if path.suffix in INDEX_SUFFIXES and path.is_file() and (problem := index_file_problem(path)):
            path.unlink(missing_ok=True)
            log.warning("Milvus Lite index file %s is damaged (%s): removed, Milvus Lite rebuilds it", path, problem)
            removed.append(path)
    for path in sorted(collections.glob("*/manifest.json")):
        try:
            manifest = json.loads(path.read_bytes())
        except (ValueError, UnicodeDecodeError):
            raise LiteDataError(_damaged(path, data_dir, "not valid JSON")) from None
        for segment in _named_files(path.parent, manifest):
            if not segment.exists():
                raise LiteDataError(_damaged(segment, data_dir, f"missing, named by {path.name}"))
            if segment.suffix == ".parquet" and (problem := parquet_problem(segment)):
                raise LiteDataError(_damaged(segment, data_dir, problem))
    return removed


def _named_files(collection: Path, manifest: object) -> list[Path]:
    """The data and delta files ``manifest`` names (a manifest of another shape: none). Only these are Lite's data:
    Lite writes a segment before the manifest that names it, so a segment the manifest does not name is what an
    interrupted write left (a kill mid-flush leaves one empty), and Lite's own recovery deletes it on open."""
    partitions = manifest.get("partitions") if isinstance(manifest, dict) else None
    named = []
    for name, partition in (partitions or {}).items() if isinstance(partitions, dict) else ():
        for key in ("data_files", "delta_files"):
            for rel in partition.get(key, []) if isinstance(partition, dict) else []:
                named.append(collection / "partitions" / str(name) / str(rel))
    return named


def _damaged(path: Path, data_dir: Path, problem: str) -> str:
    return (
        f"Milvus Lite file {path} is damaged ({problem}: lost, or cut short by a full disk or a crash): the "
        f"collection cannot be read. Fix: free the space, delete {data_dir} and run kb-retrieval ingest again"
    )


def index_file_problem(path: Path) -> str | None:
    """Why the index file at ``path`` cannot be loaded (``None``: it looks whole). NumPy arrays (FLAT) and Arrow
    files (scalar indexes) are checked by their headers and footers, JSON (sparse indexes) by parsing it, FAISS
    indexes (HNSW, IVF: ``faiss.write_index``) by reading them memory-mapped (their structure is read, the vectors
    only mapped: ~0.1 s for 20k vectors of 384 dimensions); another format is left to Lite."""
    size = path.stat().st_size
    if size == 0:
        return "empty"
    with path.open("rb") as handle:
        head = handle.read(max(len(_NPY_MAGIC), len(_ARROW_MAGIC)))
        if head.startswith(_NPY_MAGIC):
            return _npy_problem(handle, size)
        if head.startswith(_ARROW_MAGIC):
            handle.seek(max(0, size - len(_ARROW_MAGIC)))
            return None if handle.read() == _ARROW_MAGIC else f"cut short at {size} bytes (no Arrow footer)"
    if _is_faiss(head):
        return _faiss_problem(path, size)
    if head.lstrip()[:1] in (b"{", b"["):
        try:
            json.loads(path.read_bytes())
        except (ValueError, UnicodeDecodeError):
            return f"not whole JSON ({size} bytes)"
    return None


def _is_faiss(head: bytes) -> bool:
    """FAISS files start with their index's four-character code (``IHNf`` HNSW, ``IwFl`` IVF flat, ``IxF2`` flat...)."""
    return len(head) >= 4 and head[:1] == b"I" and head[1:4].isascii() and head[1:4].isalnum()


def _faiss_problem(path: Path, size: int) -> str | None:
    """Read the FAISS index memory-mapped and read-only: a file cut short fails in FAISS's own reader."""
    try:
        import faiss
    except ImportError:  # Lite without FAISS cannot load it either: Lite says so itself
        return None
    try:
        faiss.read_index(str(path), faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY)
    except Exception as exc:  # FAISS raises RuntimeError with its C++ error text
        where = str(exc).strip().splitlines()
        return f"FAISS cannot read it ({size} bytes: cut short?): {where[-1][:160] if where else type(exc).__name__}"
    return None


def _npy_problem(handle: object, size: int) -> str | None:
    """The NumPy file's header says its shape and dtype: the file must be exactly header + data long."""
    import numpy as np

    handle.seek(6)  # type: ignore[attr-defined]
    major = handle.read(2)[0]  # type: ignore[attr-defined]
    length_format, length_size = ("<H", 2) if major == 1 else ("<I", 4)
    (header_len,) = struct.unpack(length_format, handle.read(length_size))  # type: ignore[attr-defined]
    try:
        header = ast.literal_eval(handle.read(header_len).decode("latin-1"))  # type: ignore[attr-defined]
        items = int(np.prod(header["shape"]))
        expected = 8 + length_size + header_len + items * np.dtype(header["descr"]).itemsize
    except (ValueError, SyntaxError, KeyError, TypeError):
        return "its NumPy header does not read"
    return None if size == expected else f"{size} of {expected} bytes: cut short"


def parquet_problem(path: Path) -> str | None:
    """Why the Parquet file at ``path`` is not whole (``None``: its magic bytes and footer length agree)."""
    size = path.stat().st_size
    if size < 12:
        return f"{size} bytes: cut short"
    with path.open("rb") as handle:
        start = handle.read(4)
        handle.seek(size - 8)
        footer_len, end = struct.unpack("<I4s", handle.read(8))
    if start != _PARQUET_MAGIC or end != _PARQUET_MAGIC:
        return f"{size} bytes: cut short (no Parquet footer)"
    if footer_len + 12 > size:
        return f"{size} bytes: its footer says more"
    return None


# --- modes: the state dir is its owner's only, whoever calls (the CLI, a library or notebook caller) -------------

_UMASK_LOCK = threading.Lock()
_umask_depth = 0
_umask_saved = 0
#: Bits taken from every file and folder the library creates in a state dir.
PRIVATE_BITS = 0o077


@contextlib.contextmanager
def private_umask() -> Iterator[None]:
    """077 added to the process umask for the block, restored when the last such block ends (re-entrant, any
    thread): what Milvus Lite, the trace store and the snapshots create meanwhile is the owner's only, under any
    umask the caller has (000 included). The umask is the process's: a file another thread creates meanwhile is
    private too (never less private)."""
    global _umask_depth, _umask_saved
    with _UMASK_LOCK:
        if _umask_depth == 0:
            _umask_saved = os.umask(PRIVATE_BITS)
            os.umask(_umask_saved | PRIVATE_BITS)
        _umask_depth += 1
    try:
        yield
    finally:
        with _UMASK_LOCK:
            _umask_depth -= 1
            if _umask_depth == 0:
                os.umask(_umask_saved)


_AT_EXIT = False


def private_at_exit() -> None:
    """Milvus Lite writes when it closes a data dir (its manifests, index files, folders again), at process exit
    too (its own ``atexit`` hook): make that private as well. Registered after Lite's hook, this one runs first and
    leaves the exiting process's umask private for the hooks after it."""
    global _AT_EXIT
    with _UMASK_LOCK:
        if _AT_EXIT:
            return
        _AT_EXIT = True
    import atexit

    import milvus_lite.server_manager  # noqa: F401  (Lite's own exit hook registered first, so it runs after ours)

    atexit.register(lambda: os.umask(os.umask(PRIVATE_BITS) | PRIVATE_BITS))


def private_tree(root: Path) -> None:
    """Folders under ``root`` 0700 and files 0600 where they grant group or others anything (best effort: what Lite
    wrote before this process's umask was private, e.g. under an older version)."""
    if not root.is_dir():
        return
    for path in (root, *root.rglob("*")):
        with contextlib.suppress(OSError):
            if path.is_symlink():
                continue
            mode = path.stat().st_mode
            if mode & PRIVATE_BITS:
                os.chmod(path, 0o700 if path.is_dir() else 0o600)
