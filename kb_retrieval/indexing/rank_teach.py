"""Teach the document ranking on the knowledge base itself, once per index version (at its first load).

The knowledge base's sections give the pseudo-queries (:mod:`kb_retrieval.indexing.pseudo_queries`); each is looked
up through the whole pipeline, its own chunk left out by a scope, with every ranking weight 1 so that the document
ranker's record holds its raw signals (read from its ``CBEventType.RERANKING`` event, the way a LlamaIndex callback
user would); :func:`~kb_retrieval.retrieval.rank_fit.choose` picks the mixture, and it is stored beside the state,
under the index version it was taught on. :class:`~kb_retrieval.engine.KnowledgeLookup` teaches it when it first
opens a version that has none (one lookup per pseudo-query, on the memory plan where there is one: the scope that
leaves a chunk out is a row mask there); a later load of that version reads it
(:func:`kb_retrieval.retrieval.rank_fit.load_fit`). A version a reload publishes to a running lookup reads its stored
fit, or is taught on a thread of its own, its lookups ranking with the configured weights until the fit is published.
One process at a time teaches a state dir's fits (:func:`teaching_turn`): the others wait for the stored fit.

Example:
    >>> fit = teach_ranking(lookup)  # doctest: +SKIP
    >>> fit.describe()  # doctest: +SKIP
    'section 0 identity x0.5 lexical 16 (fitted on 200 pseudo-queries; pseudo-query MRR 0.310 -> 0.432)'
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from llama_index.core.callbacks.base import CallbackManager
from llama_index.core.callbacks.base_handler import BaseCallbackHandler
from llama_index.core.callbacks.schema import CBEventType, EventPayload
from llama_index.core.vector_stores.types import FilterOperator, MetadataFilter, MetadataFilters

from kb_retrieval.config import KBSettings
from kb_retrieval.indexing.pseudo_queries import PseudoQuery, SectionRow, pseudo_queries
from kb_retrieval.knowledge.chunker import BREADCRUMB_SEPARATOR
from kb_retrieval.models import EvidenceStatus
from kb_retrieval.retrieval.query_check import EmptyQueryError
from kb_retrieval.retrieval.rank_fit import PseudoCase, RankFit, choose, fit_path, load_fit, store_fit
from kb_retrieval.retrieval.stage import stage_of
from kb_retrieval.scoring_profile import ScoringProfile

try:  # the teaching turn across processes (POSIX); without it each process teaches for itself, as before
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

#: How often a process waiting for another's teaching looks for the stored fit (seconds).
TURN_POLL_S = 0.25

#: Every ranking weight at 1: the ranker's record then holds each signal's raw value.
UNIT_WEIGHTS = {name: 1.0 for name in ScoringProfile.model_fields if name.startswith("rank_")}


class _RankerSignals(BaseCallbackHandler):
    """Keeps the document ranker's last call: its candidates in the order it was given them (retrieval's), each
    with its raw signals."""

    def __init__(self, ranker_name: str) -> None:
        super().__init__([], [])
        self._name = ranker_name
        self._given: dict[str, list[str]] = {}
        self.last: list[tuple[str, dict[str, float]]] = []

    def on_event_start(
        self,
        event_type: CBEventType,
        payload: dict[str, Any] | None = None,
        event_id: str = "",
        parent_id: str = "",
        **kwargs: Any,
    ) -> str:
        payload = payload or {}
        if event_type == CBEventType.RERANKING and payload.get(EventPayload.MODEL_NAME) == self._name:
            self._given[event_id] = [stage_of(n).candidate.source for n in payload.get(EventPayload.NODES) or []]
        return event_id

    def on_event_end(
        self, event_type: CBEventType, payload: dict[str, Any] | None = None, event_id: str = "", **kwargs: Any
    ) -> None:
        if event_id in self._given and payload:
            given = self._given.pop(event_id)
            signals = {}
            for node in payload.get(EventPayload.NODES) or []:
                stage = stage_of(node)
                signals[stage.candidate.source] = dict(stage.rerank.ranking) if stage.rerank is not None else {}
            self.last = [(source, signals.get(source, {})) for source in given]

    def start_trace(self, trace_id: str | None = None) -> None:
        return None

    def end_trace(self, trace_id: str | None = None, trace_map: dict[str, list[str]] | None = None) -> None:
        return None


class KnowledgeBaseUnavailable(RuntimeError):
    """A lookup of the fit could not search the knowledge base (an outage): no fit is taught from it."""


class TeachingStopped(RuntimeError):
    """The lookup object was closed while a version was taught: no fit is taught."""


class _NoTraces:
    def record(self, *args: Any, **kwargs: Any) -> bool:
        return False


def section_rows(client: Any, settings: KBSettings, read: Iterable[dict[str, Any]] | None = None) -> list[SectionRow]:
    """Every chunk of the collection as a :class:`SectionRow`, from one scan (or from ``read``: rows already read
    with these fields, the memory plan's mirror: at 100k chunks a second scan of Milvus Lite took ~25 s)."""
    from kb_retrieval.indexing.milvus import iter_rows

    fields = [
        settings.schema_fields.id_field,
        settings.schema_fields.source_field,
        settings.schema_fields.content_field,
        settings.schema_fields.metadata_field,
    ]
    rows = []
    for row in read if read is not None else iter_rows(client, settings, fields):
        meta = row.get(settings.schema_fields.metadata_field) or {}
        rows.append(
            SectionRow(
                chunk_id=str(row[settings.schema_fields.id_field]),
                source=str(row[settings.schema_fields.source_field]),
                title=str(meta.get("title") or ""),
                breadcrumb=[h for h in str(meta.get("breadcrumb") or "").split(BREADCRUMB_SEPARATOR) if h],
                position=int(meta.get("position") or 0),
                content=str(row.get(settings.schema_fields.content_field) or ""),
            )
        )
    return rows


def ranker_signals(
    lookup: Any, texts: list[str], left_out: list[str] | None = None, stop: threading.Event | None = None
) -> list[PseudoCase | None]:
    """Each text looked up (with the chunk of ``left_out`` at the same index left out by a scope, when given) with
    every ranking weight 1: the candidates in retrieval's order with the ranker's raw signals, as a
    :class:`PseudoCase` with no answer (``source`` ""); ``None`` when the lookup found nothing. No trace is written.
    Raises :class:`TeachingStopped` once ``stop`` is set."""
    from kb_retrieval.retrieval.doc_rank import DocumentRanker

    handler = _RankerSignals(DocumentRanker.class_name())
    scoring = lookup.settings.scoring.variant("unit-weights", **UNIT_WEIGHTS, fit_ranking=False)
    unit = lookup.with_settings(scoring=scoring)
    unit = unit._variant(unit.settings, CallbackManager([handler]))
    unit.traces, unit.sidecar = _NoTraces(), None  # the knowledge base's own questions are no tool calls
    out: list[PseudoCase | None] = []
    for i, text in enumerate(texts):
        if stop is not None and stop.is_set():
            raise TeachingStopped("the lookup was closed")
        handler.last = []
        chunk = left_out[i] if left_out else ""
        scope = (
            MetadataFilters(filters=[MetadataFilter(key="id", value=chunk, operator=FilterOperator.NE)])
            if chunk
            else None
        )
        try:
            result = unit.lookup_detailed(text, filters=scope).result
        except EmptyQueryError:  # a blank golden line: nothing found
            out.append(None)
            continue
        if result.evidence_status is EvidenceStatus.UNAVAILABLE:
            raise KnowledgeBaseUnavailable(result.message)
        found = result.found
        out.append(PseudoCase("", handler.last) if found else None)
    return out


def collect(lookup: Any, queries: list[PseudoQuery], stop: threading.Event | None = None) -> list[PseudoCase]:
    """Each pseudo-query looked up with its own chunk left out; its answer, candidates and their raw signals."""
    cases = ranker_signals(lookup, [q.text for q in queries], [q.chunk_id for q in queries], stop)
    return [PseudoCase(q.source, c.candidates if c else []) for q, c in zip(queries, cases, strict=True)]


def teach_ranking(lookup: Any, stop: threading.Event | None = None) -> RankFit | None:
    """The ranking fit of ``lookup``'s current index version (a :class:`~kb_retrieval.engine.KnowledgeLookup`): the
    stored one, else taught now and stored. ``None`` when the fit is off (``fit_ranking``, ``fit_queries`` 0) or
    document ranking is, or when ``stop`` is set while it is taught."""
    settings = lookup.settings
    scoring = settings.scoring
    if not (settings.retrieval.document_ranking and scoring.fit_ranking and scoring.fit_queries):
        return None
    version = lookup.state.index_version
    if not version or not lookup.state.known_documents:  # nothing ingested yet: nothing to teach, nothing written
        return None
    inputs = scoring.fit_inputs()
    if (stored := load_fit(settings.storage.state_dir, version, inputs)) is not None:
        return stored
    try:
        with teaching_turn(settings.storage.state_dir, version, stop, taught_under=inputs) as stored:
            return stored if stored is not None else _teach(lookup, version, inputs, stop)
    except TeachingStopped:
        log.info("document ranking fit not taught: the lookup was closed")
        return None


@contextlib.contextmanager
def teaching_turn(
    state_dir: Path,
    version: str,
    stop: threading.Event | None = None,
    *,
    taught_under: dict[str, float] | None = None,
) -> Iterator[RankFit | None]:
    """One process at a time teaches a state dir's versions (``serve --workers N``: each worker opens a version a
    reload publishes): the block runs holding ``rank-fit/.teaching.lock``; it is given the version's fit when
    another process stored it meanwhile (then there is nothing to teach), else ``None``. A process that dies
    teaching lets the lock go (``flock``), and a waiting one teaches instead. ``taught_under``: only a fit taught
    under these inputs counts (:func:`~kb_retrieval.retrieval.rank_fit.load_fit`).

    Raises:
        TeachingStopped: ``stop`` was set while waiting.
    """
    if fcntl is None:  # no flock: each process teaches for itself
        yield None
        return
    lock = fit_path(state_dir, version).with_name(".teaching.lock")
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
        handle = open(lock, "a+b")  # noqa: SIM115 - held for the block
    except OSError:  # a read-only state dir: nobody stores a fit in it; teach for this process
        yield None
        return
    with handle:
        if (stored := _await_turn(handle, state_dir, version, stop, taught_under)) is not None:
            yield stored
            return
        try:
            yield load_fit(state_dir, version, taught_under)  # stored by the process that held the lock before
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _await_turn(
    handle: Any,
    state_dir: Path,
    version: str,
    stop: threading.Event | None,
    taught_under: dict[str, float] | None,
) -> RankFit | None:
    """Take the teaching lock on ``handle`` (``None``), or the version's fit another process stored meanwhile."""
    waiting = stop or threading.Event()
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return None
        except BlockingIOError:
            if (stored := load_fit(state_dir, version, taught_under)) is not None:
                return stored
            if waiting.wait(TURN_POLL_S):
                raise TeachingStopped("closed while another process taught the version") from None


def _teach(lookup: Any, version: str, inputs: dict[str, float], stop: threading.Event | None) -> RankFit | None:
    """Teach ``version``'s fit on ``lookup`` and store it with ``inputs``, what it is taught under (the caller holds
    the teaching turn)."""
    settings = lookup.settings
    scoring = settings.scoring
    # The memory plan holds every row already (the state of this version): no second scan of the collection.
    mirror = lookup.state.memory
    rows = section_rows(lookup.client, settings, mirror.rows if mirror is not None else None)
    queries = pseudo_queries(rows, limit=scoring.fit_queries)
    configured = scoring.ranking_weights()
    if len(queries) < scoring.fit_min_queries:
        reason = f"kept: {len(queries)} pseudo-queries, fewer than {scoring.fit_min_queries}"
        fit = RankFit(version, configured, configured.get("chunk", 0.0), 1.0, len(queries), reason)
    else:
        try:
            cases = collect(lookup, queries, stop)
        except KnowledgeBaseUnavailable as exc:
            log.warning("document ranking fit not taught (the knowledge base could not be searched: %s)", exc)
            return None
        if sum(1 for c in cases if c.candidates) < scoring.fit_min_queries:
            # Lookups that find nothing teach nothing (a path that answers no search): no fit, nothing stored.
            log.warning("document ranking fit not taught: too few pseudo-queries found anything")
            return None
        if lookup.state.index_version != version:  # a reload during the lookups: they are not all of one version
            log.info("document ranking fit not taught: the index version changed while it was taught")
            return None
        fit = choose(cases, configured, index_version=version, min_queries=scoring.fit_min_queries)
    fit = dataclasses.replace(fit, taught_under=inputs)
    try:
        store_fit(settings.storage.state_dir, fit)
    except OSError as exc:  # a read-only state dir: the fit serves this process only
        log.warning("document ranking fit not stored (%s): it is taught again on the next load", exc)
    log.info("document ranking: %s", fit.describe())
    return fit
