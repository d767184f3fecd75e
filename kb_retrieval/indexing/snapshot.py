"""A local snapshot of the state a lookup object reads from every chunk, one per index version.

A :class:`~kb_retrieval.engine.KnowledgeLookup` reads every chunk of the collection at start: the memory plan's mirror
(vectors, BM25 postings, rows) and the exact-identifier index. At 100k chunks that read and build took ~50 s on
Milvus Lite in pages of 2000 rows (Lite's own query iterator ~22 s, decoding the rows ~8 s, the indexes ~20 s), still
~21-24 s in pages of 8192 (docs/measurements.md), and it was paid again by
every process: each CLI call, each worker of a service, each notebook kernel. What it builds depends only on what the
collection holds, and the index version names that (ingest publishes a new one after every write; a version never
comes back). So the first process to read a version writes what it built to ``<state_dir>/snapshots``, and a later
process on this host with the same index version, settings and code loads it instead (~1 s at 100k).

Milvus stays the store of record: a snapshot is only a cache of it. A version not seen before is read from Milvus;
a snapshot written from a read that an ingest overlapped is not kept (the version is read again after the read and
must be the one before); one snapshot is kept per collection and URI (a new one replaces the old); a file that does
not load (truncated, another format, another key) is read past and replaced. Rows written to the collection without
a kb-retrieval ingest publish no new version: as the freshness check, the snapshot does not see them.

The file is a header line (format, key and the sha256 of the payload, JSON) and a pickle of the parts. A payload
whose digest differs from its header's (bits flipped or zeroed on disk, a file cut short) is a cache miss with a
warning: the collection is read again and the snapshot rewritten, so a damaged snapshot never answers a lookup.
Loading admits only the classes those parts are made of (:class:`_Unpickler`): a file that names any other class is
refused, not run. The digest checks for damage, not for tampering: anyone who can write the state dir can rewrite a
snapshot and its digest alike (the state dir is the owner's alone).

Example:
    >>> key = snapshot_key(settings, version, plan="memory", lexical_mode="milvus_bm25")  # doctest: +SKIP
    >>> parts = load_snapshot(settings, key)  # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kb_retrieval import __version__
from kb_retrieval.atomic import atomic_write
from kb_retrieval.config import KBSettings

log = logging.getLogger(__name__)

#: Changes when the file layout or the parts change shape in a way the code digest cannot see.
SNAPSHOT_FORMAT = 2
_MAGIC = b"kb-retrieval-snapshot"
_SUFFIX = ".snapshot"

#: The modules whose classes a snapshot holds: their source is part of the key, so a snapshot written by other code
#: (an upgrade, a checkout of another commit) is never loaded into objects of a different shape.
_PART_MODULES = (
    "kb_retrieval.indexing.snapshot",
    "kb_retrieval.retrieval.l1.memory",
    "kb_retrieval.retrieval.bm25.analysis",
    "kb_retrieval.retrieval.bm25.postings",
    "kb_retrieval.retrieval.exact",
)

#: Every class the parts are made of (numpy's array reconstruction included); nothing else is loaded.
_ALLOWED = {
    ("kb_retrieval.indexing.snapshot", "SnapshotParts"),
    ("kb_retrieval.retrieval.l1.memory", "MemoryMirror"),
    ("kb_retrieval.retrieval.bm25.postings", "Bm25Postings"),
    ("kb_retrieval.retrieval.exact", "ExactIdentifierIndex"),
    ("numpy", "dtype"),
    ("numpy", "ndarray"),
    ("numpy._core.numeric", "_frombuffer"),
    ("numpy.core.numeric", "_frombuffer"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "_reconstruct"),
}


@dataclass
class SnapshotParts:
    """What a lookup object builds from every chunk (``None``: a part this configuration does not build)."""

    memory: Any = None  # MemoryMirror
    exact: Any = None  # ExactIdentifierIndex


class _Unpickler(pickle.Unpickler):
    """Loads only the classes in ``_ALLOWED``: a snapshot is data, and a file that says otherwise is refused."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _ALLOWED:
            raise pickle.UnpicklingError(f"a snapshot may not hold {module}.{name}")
        return super().find_class(module, name)


def _code_digest() -> str:
    """A digest of the source of the modules whose objects a snapshot holds."""
    import importlib

    digest = hashlib.sha256()
    for name in _PART_MODULES:
        module = importlib.import_module(name)
        digest.update(Path(str(module.__file__)).read_bytes())
    return digest.hexdigest()


_CODE_DIGEST: str | None = None


def _code() -> str:
    global _CODE_DIGEST
    if _CODE_DIGEST is None:
        _CODE_DIGEST = _code_digest()
    return _CODE_DIGEST


def _family(settings: KBSettings) -> str:
    """The collection this snapshot is of (where it lives and its name): one snapshot is kept per family. A Lite
    file inside the state dir counts by its place there, so a state dir moved or copied keeps its snapshot."""
    where = f"{settings.milvus_location()}\n{settings.storage.collection}"
    return hashlib.sha256(where.encode()).hexdigest()[:12]


def snapshot_key(settings: KBSettings, version: str, *, plan: str, lexical_mode: str) -> str | None:
    """The key of the state built for index ``version`` with these settings; ``None`` where no snapshot applies
    (snapshots off; a collection no kb-retrieval ingest versioned; BM25 in process, whose bm25s tokenizer does not
    pickle: that state is read from the collection as before)."""
    if not settings.storage.state_snapshots or not version or lexical_mode == "in_process_bm25":
        return None
    # The settings that decide what the parts hold; another value of any other setting reads the same parts.
    build = {
        "format": SNAPSHOT_FORMAT,
        "package": __version__,
        "code": _code(),
        "family": _family(settings),
        "version": version,
        "plan": plan,
        "lexical_mode": lexical_mode,
        "exact_signals": settings.scoring.exact_signals,
        "fields": [
            settings.schema_fields.id_field,
            settings.schema_fields.content_field,
            settings.schema_fields.category_field,
            settings.schema_fields.metadata_field,
            settings.schema_fields.source_field,
            settings.schema_fields.vector_field,
            settings.schema_fields.lexical_text_field,
        ],
        "memory_plan_max_mb": settings.retrieval.memory_plan_max_mb,
        "dim": settings.schema_fields.dim,
        "metric": settings.schema_fields.metric.upper(),
    }
    return hashlib.sha256(json.dumps(build, sort_keys=True).encode()).hexdigest()


def snapshot_dir(settings: KBSettings) -> Path:
    """Where this state directory keeps its snapshots."""
    return settings.storage.state_dir / "snapshots"


def _path(settings: KBSettings, key: str) -> Path:
    return snapshot_dir(settings) / f"{settings.storage.collection}-{_family(settings)}-{key[:24]}{_SUFFIX}"


def load_snapshot(settings: KBSettings, key: str) -> SnapshotParts | None:
    """The parts written under ``key``, or ``None`` when there is no such snapshot or it does not load (logged)."""
    path = _path(settings, key)
    try:
        with path.open("rb") as handle:
            header = json.loads(handle.readline())
            if header.get("magic") != _MAGIC.decode() or header.get("key") != key:
                raise ValueError("its header names another format or key")
            payload = handle.read()
        if hashlib.sha256(payload).hexdigest() != header.get("sha256"):
            raise ValueError("its payload does not match the digest in its header (damaged on disk)")
        parts = _Unpickler(io.BytesIO(payload)).load()
    except FileNotFoundError:
        return None
    except Exception as exc:  # a damaged or foreign file is a cache miss, never an error of the lookup
        log.warning("state snapshot %s does not load (%s): reading the collection instead", path.name, exc)
        return None
    if not isinstance(parts, SnapshotParts):
        log.warning("state snapshot %s holds %s, not snapshot parts: reading the collection", path.name, type(parts))
        return None
    if parts.memory is not None:
        parts.memory.bind(settings)
    return parts


def _header(key: str, sha256: str) -> bytes:
    header = {"magic": _MAGIC.decode(), "format": SNAPSHOT_FORMAT, "key": key, "sha256": sha256}
    return json.dumps(header, sort_keys=True).encode() + b"\n"


class _HashingWriter:
    """A binary file that hashes what passes through it (what ``pickle.dump`` writes the payload to)."""

    def __init__(self, handle: Any) -> None:
        self._handle = handle
        self._hash = hashlib.sha256()

    def write(self, data: Any) -> int:
        self._hash.update(data)
        return int(self._handle.write(data))

    def hexdigest(self) -> str:
        return self._hash.hexdigest()


def write_snapshot(settings: KBSettings, key: str, parts: SnapshotParts) -> Path | None:
    """Write ``parts`` under ``key`` (a temporary file, then a rename) and remove the family's older snapshots.
    A failure (a read-only or full disk) is logged and leaves no file behind: the next process reads Milvus."""
    folder = snapshot_dir(settings)
    path = _path(settings, key)
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        # On disk before the rename (atomic_write): a crash leaves the old snapshot or the new one.
        with atomic_write(path, "wb") as handle:
            # The header holds the payload's digest, known once the payload is written: a placeholder of the same
            # length first, rewritten in place after (the payload streams to disk, never held twice in memory).
            handle.write(_header(key, "0" * 64))
            digest = _HashingWriter(handle)
            pickle.dump(parts, digest, protocol=pickle.HIGHEST_PROTOCOL)
            handle.seek(0)
            handle.write(_header(key, digest.hexdigest()))
    except Exception as exc:
        log.warning("state snapshot not written to %s: %s", folder, exc)
        return None
    for older in folder.glob(f"{settings.storage.collection}-{_family(settings)}-*{_SUFFIX}"):
        if older != path:
            older.unlink(missing_ok=True)
    return path
