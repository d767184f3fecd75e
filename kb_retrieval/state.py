"""The retrieval state of one index version: read in one place, frozen, replaced whole.

What a lookup reads besides the settings comes from what the collection holds: the L0 index and its hint provider,
the exact-identifier index and the rare terms named in titles and headings, the in-process BM25 index (where BM25
runs in process), the document vectors, and on the memory plan the mirror of the collection. All of it is one
:class:`RetrievalState`, loaded by :func:`load_state` for one index version and never changed afterwards (the parts
that fill a cache while they serve, the mirror's candidates, keep their own lock-free caches of immutable rows).

A :class:`StateHolder` keeps the current state for a lookup object and every settings variant of it: one freshness
check (:mod:`kb_retrieval.freshness`), and after another process's ingest a new state, built beside the old one and
published by one assignment. A lookup in flight keeps the state (and the pipeline built on it,
:mod:`kb_retrieval.pipeline`) it started with.

Example:
    >>> holder = StateHolder(StateLoader(client, settings, plan, reason, "milvus_bm25"), interval_s=5)  # doctest: +SKIP
    >>> holder.current.index_version  # doctest: +SKIP
    '1733327000.123'
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from pymilvus import MilvusClient

from kb_retrieval.config import KBSettings
from kb_retrieval.freshness import FreshnessCheck
from kb_retrieval.indexing.doc_vectors import DocumentVectors
from kb_retrieval.indexing.index_version import index_version
from kb_retrieval.indexing.l0_index import L0Index
from kb_retrieval.indexing.milvus import iter_rows
from kb_retrieval.indexing.snapshot import SnapshotParts, load_snapshot, snapshot_key, write_snapshot
from kb_retrieval.models import LexicalMode
from kb_retrieval.retrieval.bm25 import LexicalIndex, lexical_document
from kb_retrieval.retrieval.calibration import Background, background_of
from kb_retrieval.retrieval.deadline import Deadline
from kb_retrieval.retrieval.exact import ExactIdentifierIndex, named_terms
from kb_retrieval.retrieval.l0_hints import L0HintProvider
from kb_retrieval.retrieval.l1.base import title_of
from kb_retrieval.retrieval.l1.memory import MemoryMirror, MirrorTooLargeError
from kb_retrieval.retrieval.rank_fit import RankFit, load_fit

log = logging.getLogger(__name__)

__all__ = ["RetrievalState", "StateHolder", "StateLoader", "load_state"]


@dataclass(frozen=True)
class RetrievalState:
    """Everything a lookup reads of one index version (frozen: a reload makes a new one).

    ``plan``/``plan_reason``: where searches run (``memory``: the mirror; ``milvus``), which a collection past the
    mirror's bound turns to ``milvus`` at load. ``source``: ``snapshot`` or ``milvus``, and ``read_s`` the seconds the
    read of every chunk took (``stats``, the bench).
    """

    index_version: str
    l0: L0HintProvider
    l0_off_reason: str | None
    plan: str
    plan_reason: str
    lexical: LexicalIndex | None = None
    exact: ExactIdentifierIndex | None = None
    named_terms: dict[str, frozenset[str]] = field(default_factory=dict)
    doc_vectors: DocumentVectors | None = None
    rank_fit: RankFit | None = None
    memory: MemoryMirror | None = None
    source: str = "milvus"
    read_s: float = 0.0
    #: The similarity out-of-document questions reach on this index version (retrieval/calibration.py): what found
    #: and relevance are calibrated from; None: not measured (the settings' thresholds).
    background: Background | None = None

    @property
    def known_documents(self) -> int:
        """Documents the L0 index says the collection holds (0: unknown)."""
        return len(self.l0.index.documents)


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for the block (as it was before, after it); reference counting still
    frees what the block drops."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@dataclass(frozen=True)
class StateLoader:
    """What a state is read with: the client, the settings, the plan asked for and where BM25 runs."""

    client: MilvusClient
    settings: KBSettings
    plan: str
    plan_reason: str
    lexical_mode: LexicalMode
    #: The query encoder, which measures the state's background (None: found and relevance keep the settings).
    encoder: Any = None

    def load(self, previous: RetrievalState | None = None) -> RetrievalState:
        """A state read now (the plan the previous state settled on, if any); see :func:`load_state`."""
        plan, reason = (previous.plan, previous.plan_reason) if previous is not None else (self.plan, self.plan_reason)
        return load_state(
            self.client,
            self.settings,
            plan=plan,
            plan_reason=reason,
            lexical_mode=self.lexical_mode,
            encoder=self.encoder,
        )


def load_state(
    client: MilvusClient,
    settings: KBSettings,
    *,
    plan: str,
    plan_reason: str,
    lexical_mode: LexicalMode,
    encoder: Any = None,
) -> RetrievalState:
    """Read the retrieval state kept in Milvus (the L0 index, the document vectors, the BM25 corpus), or this host's
    snapshot of the index version's chunk-wide parts, and make the state of it.

    The cyclic garbage collector waits meanwhile: the build makes millions of short-lived containers and none of
    them a cycle, and at 100k chunks its repeated full passes over them took most of the build's time.
    """
    with _collector_paused():
        state = _read(client, settings, plan, plan_reason, lexical_mode)
    background = background_of(state.memory, settings, encoder, state.index_version)
    return dataclasses.replace(state, background=background)


def _read(
    client: MilvusClient, settings: KBSettings, plan: str, plan_reason: str, lexical_mode: LexicalMode
) -> RetrievalState:
    scoring = settings.scoring
    index = L0Index.load_from_milvus(client, settings)
    l0 = L0HintProvider(
        index,
        max_keyword_documents=scoring.l0_max_keyword_documents,
        title_coverage_min=scoring.l0_title_coverage_min,
        title_coverage_limit=scoring.l0_title_coverage_limit,
    )
    # What is built from every chunk comes from this host's snapshot of the index version when there is one.
    started, asked = time.perf_counter(), plan
    key = snapshot_key(settings, index.index_version, plan=plan, lexical_mode=lexical_mode)
    parts = load_snapshot(settings, key) if key else None
    lexical: LexicalIndex | None
    if parts is not None:
        memory, lexical, exact = parts.memory, None, parts.exact
    else:
        memory, plan, plan_reason = _load_memory(client, settings, plan, plan_reason, lexical_mode)
        # In milvus_bm25 mode Milvus keeps BM25 (always as fresh as the collection); the scan serves the exact
        # index. The memory plan has every row already: the same rows serve both, with no second scan.
        needs_scan = lexical_mode == "in_process_bm25" or scoring.exact_signals
        lexical, exact = (
            build_lexical(client, settings, lexical_mode, memory.rows if memory else None)
            if needs_scan
            else (None, None)
        )
    read_s = round(time.perf_counter() - started, 3)
    doc_vectors = DocumentVectors.load_from_milvus(client, settings) if settings.retrieval.document_ranking else None
    # The ranking mixture this index version taught itself at ingest (kb_retrieval.indexing.rank_teach), if any.
    # One taught under another scoring profile (its weights, fit_queries) is not this one's: it is taught again.
    rank_fit = (
        load_fit(settings.storage.state_dir, index.index_version, settings.scoring.fit_inputs())
        if settings.scoring.fit_ranking
        else None
    )
    # What makes a word a rare term: the documents' own titles and headings, as recorded at ingest.
    names = named_terms({s: [e.title, *e.headings] for s, e in index.documents.items()}) if exact else {}
    if parts is None and key and plan == asked:
        _write_snapshot(client, settings, key, index.index_version, SnapshotParts(memory=memory, exact=exact))
    return RetrievalState(
        index_version=index.index_version,
        l0=l0,
        l0_off_reason=index.off_reason,
        plan=plan,
        plan_reason=plan_reason,
        lexical=lexical,
        exact=exact,
        named_terms=names,
        doc_vectors=doc_vectors,
        rank_fit=rank_fit,
        memory=memory,
        source="snapshot" if parts is not None else "milvus",
        read_s=read_s,
    )


def _load_memory(
    client: MilvusClient, settings: KBSettings, plan: str, plan_reason: str, lexical_mode: LexicalMode
) -> tuple[MemoryMirror | None, str, str]:
    """The memory plan's mirror, read from Milvus now (``None`` on the milvus plan), and the plan with its reason. A
    collection past the bound turns the state to the milvus plan, with the reason (``stats``, the trace notes)."""
    if plan != "memory":
        return None, plan, plan_reason
    try:
        mirror = MemoryMirror.load(
            client, settings, lexical=lexical_mode == "milvus_bm25", max_mb=settings.retrieval.memory_plan_max_mb
        )
    except MirrorTooLargeError as exc:
        log.warning("%s: searching in Milvus", exc)
        return None, "milvus", str(exc)
    return mirror, plan, plan_reason


def build_lexical(
    client: MilvusClient,
    settings: KBSettings,
    lexical_mode: LexicalMode,
    read: Iterable[dict[str, Any]] | None = None,
) -> tuple[LexicalIndex | None, ExactIdentifierIndex | None]:
    """BM25 (in process only: text with its header) and the exact-identifier index over the chunks the collection
    holds now, from one scan (or from ``read``: rows already read, with the same fields)."""
    s = settings
    fields = [
        s.schema_fields.id_field,
        s.schema_fields.content_field,
        s.schema_fields.category_field,
        s.schema_fields.metadata_field,
        s.schema_fields.source_field,
        s.schema_fields.title_field,
    ]
    fields = list(dict.fromkeys(f for f in fields if f))
    rows = []
    for row in read if read is not None else iter_rows(client, s, fields):
        meta = (row.get(s.schema_fields.metadata_field) if s.schema_fields.metadata_field else None) or {}
        title = meta.get("title") or title_of(s, row)
        text = lexical_document(title, meta.get("breadcrumb"), row.get(s.schema_fields.content_field, ""))
        category = (row.get(s.schema_fields.category_field) if s.schema_fields.category_field else None) or ""
        rows.append(
            (str(row[s.schema_fields.id_field]), str(row.get(s.schema_fields.source_field) or ""), text, category)
        )
    in_process = lexical_mode == "in_process_bm25"
    lexical = LexicalIndex.build((r[0], r[2], r[3]) for r in rows) if in_process else None
    exact = ExactIdentifierIndex.build((r[0], r[1], r[2]) for r in rows) if s.scoring.exact_signals else None
    return lexical, exact


def _write_snapshot(client: MilvusClient, settings: KBSettings, key: str, version: str, parts: SnapshotParts) -> None:
    """Snapshot what was read, unless an ingest published a new version meanwhile (what was read may then hold
    part of it: it is kept in memory until the freshness check reloads, never under the older version's key)."""
    try:
        unchanged = index_version(client, settings, timeout=settings.storage.milvus_timeout_s) == version
    except Exception as exc:
        log.warning("state snapshot not written (the index version could not be read again): %s", exc)
        return
    if unchanged:
        write_snapshot(settings, key, parts)


class StateHolder:
    """The current :class:`RetrievalState` of a lookup object and all its settings variants, kept fresh by one
    freshness check; a reload publishes a new state by one assignment (``current`` is never changed in place)."""

    def __init__(self, loader: StateLoader, interval_s: float) -> None:
        self._loader = loader
        self.current: RetrievalState = loader.load()
        self._freshness = FreshnessCheck(self._reload_if_changed, interval_s)
        #: Told of each state a reload publishes, on the freshness check's thread (it must hand long work on).
        self.on_reload: Callable[[RetrievalState], None] | None = None

    def refresh(self, *, force: bool = False, deadline: Deadline | None = None) -> bool:
        """Reload when another process's ingest changed the index version (checked at most every ``interval_s``, off
        the request path: see :mod:`kb_retrieval.freshness`); True when reloaded. Never raises."""
        return self._freshness.run(deadline=deadline, force=force)

    def publish(self, state: RetrievalState) -> None:
        """Make ``state`` the current one (what a reload does; tests give a state of their own)."""
        self.current = state

    def _reload_if_changed(self, force: bool = False) -> bool:
        """The freshness check: the index version (within ``milvus_timeout_s``), and a reload when it changed
        (``force``: whatever it is)."""
        loader, state = self._loader, self.current
        try:
            current = index_version(loader.client, loader.settings, timeout=loader.settings.storage.milvus_timeout_s)
            # '' is also what an unreadable meta collection gives: not a reason to drop a state we have.
            if not force and (current == state.index_version or (not current and state.index_version)):
                return False
            log.info("index version changed (%s -> %s): reloading the retrieval state", state.index_version, current)
            self.publish(loaded := loader.load(state))
        except Exception as exc:
            log.warning("refreshing the retrieval state failed (kept the previous one): %s", exc)
            return False
        if self.on_reload is not None:
            self.on_reload(loaded)
        return True
