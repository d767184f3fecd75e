"""Lookups for the server: on a bounded thread pool, never on the event loop, with per-request setting overrides.

A lookup is mostly CPU work under the GIL (embedding, rerank), so the pool has ``retriever_workers`` threads (2 by
default, the cores here) and at most ``max_pending`` lookups are admitted at once; past that a request is told the
server is busy instead of queueing without bound.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, TypeVar

from llama_index.core.vector_stores.types import MetadataFilters

from kb_retrieval.engine import KnowledgeLookup
from kb_retrieval.models import LookupResult
from kb_retrieval.retrieval.deadline import Deadline

T = TypeVar("T")


class BusyError(RuntimeError):
    """Every admission slot is taken: the client should retry shortly (HTTP 503). Nothing of the request ran."""


class WorkerWaitError(TimeoutError):
    """No worker was free before the request's deadline (``lookup_timeout_s`` from its arrival): not run (503)."""


class MilvusDownError(WorkerWaitError):
    """Milvus failed the last lookup: until one probing lookup gets through, the others are not started (503)."""


#: After a lookup found Milvus unavailable, how long the others fail fast while one lookup at a time probes it.
FAIL_FAST_S = 5.0


class QueryTooLongError(ValueError):
    """The query is longer than the server accepts (``max_query_chars``)."""


class LookupRunner:
    """Runs ``KnowledgeLookup.lookup`` on a pool of ``workers`` threads; ``max_pending`` admitted at once.

    A request has one deadline, ``lookup_timeout_s`` from its arrival, covering the wait for a worker: a lookup
    that waited until it had passed is not started (``WorkerWaitError``), and one that started gets what is left of
    it (not a full timeout of its own), so a request is answered within ``lookup_timeout_s`` (and the
    ``DEADLINE_GRACE_S`` a Milvus call that ignores its own timeout is given) of its arrival. Once a lookup found
    Milvus unavailable, for ``FAIL_FAST_S`` one lookup at a time probes it and the others fail at once
    (``MilvusDownError``), until a lookup gets through.

    Example:
        >>> runner = LookupRunner(lookup, workers=2, max_pending=64)  # doctest: +SKIP
        >>> result = await runner.lookup("etcd has no leader", {"max_evidence_blocks": 3})  # doctest: +SKIP
    """

    def __init__(self, lookup: KnowledgeLookup, *, workers: int, max_pending: int, max_overrides: int = 32) -> None:
        self.base = lookup
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kb-lookup")
        self.max_pending = max_pending
        self._pending = 0
        self._pending_lock = threading.Lock()
        self._variants: OrderedDict[tuple[tuple[str, Any], ...], KnowledgeLookup] = OrderedDict()
        self._variants_lock = threading.Lock()
        self._max_overrides = max_overrides
        self._down_until = 0.0  # time.monotonic() until which Milvus counts as down (0: not known down)
        self._probe = threading.Lock()  # held by the one lookup that probes a Milvus known down

    @property
    def max_query_chars(self) -> int:
        return self.base.settings.retrieval.max_query_chars

    def check_length(self, query: str) -> None:
        if len(query) > self.max_query_chars:
            raise QueryTooLongError(
                f"query is {len(query)} characters; the server accepts at most {self.max_query_chars} "
                "(KB_MAX_QUERY_CHARS)"
            )

    def variant(self, overrides: dict[str, Any]) -> KnowledgeLookup:
        """The pipeline with ``overrides`` applied (validated like any setting), kept for the next request that
        asks the same; the base pipeline when there are none."""
        if not overrides:
            return self.base
        key = tuple(sorted(overrides.items()))
        with self._variants_lock:
            found = self._variants.get(key)
            if found is not None:
                self._variants.move_to_end(key)
                return found
        made = self.base.with_settings(**overrides)
        with self._variants_lock:
            self._variants[key] = made
            while len(self._variants) > self._max_overrides:
                self._variants.popitem(last=False)
        return made

    @contextmanager
    def admitted(self, count: int = 1) -> Iterator[None]:
        """Admit ``count`` lookups at once, or none (``BusyError``): a batch (an Alertmanager payload) starts only
        when all of it may run, so a 503 means nothing ran and a retry duplicates no work."""
        with self._pending_lock:
            if self._pending + count > self.max_pending:
                raise BusyError(
                    "the server is busy: every lookup slot is taken (KB_SERVER_MAX_PENDING); nothing was run, "
                    "retry shortly"
                    if count == 1
                    else f"the server is busy: {count} lookups do not fit in the free slots (KB_SERVER_MAX_PENDING "
                    f"{self.max_pending}); nothing was run, retry shortly"
                )
            self._pending += count
        try:
            yield
        finally:
            with self._pending_lock:
                self._pending -= count

    async def lookup(
        self,
        query: str,
        overrides: dict[str, Any] | None = None,
        *,
        filters: MetadataFilters | None = None,
        arrived: float | None = None,
        admitted: bool = False,
    ) -> LookupResult:
        """One lookup on the pool (the overridden pipeline assembled there too), scoped by ``filters``. Raises
        ``BusyError`` when ``max_pending`` lookups are already admitted (unless the caller ``admitted`` it), a
        ``WorkerWaitError`` when no worker was free within ``lookup_timeout_s`` of ``arrived`` (``time.monotonic``,
        default now), a ``ValidationError`` for an override no setting accepts, a ``ScopeFilterError`` for a
        filter the collection cannot answer (an unknown key)."""
        arrived = time.monotonic() if arrived is None else arrived
        args = (query, overrides or {}, filters, arrived)
        if admitted:
            return await self._on_pool(self._lookup, *args)
        return await self.call(self._lookup, *args)

    async def lookup_rendered(
        self,
        render: Callable[[LookupResult], T],
        query: str,
        overrides: dict[str, Any] | None = None,
        *,
        filters: MetadataFilters | None = None,
    ) -> T:
        """:meth:`lookup`, then ``render(result)`` on the same pool thread: a response body (the result's JSON is
        ~1 ms of CPU under the GIL) is built there, not on the event loop, which meanwhile reads and answers the
        other requests. Raises what :meth:`lookup` raises, and what ``render`` raises."""
        args = (query, overrides or {}, filters, time.monotonic())
        return await self.call(self._lookup_rendered, render, *args)

    def _lookup_rendered(self, render: Callable[[LookupResult], T], *args: Any) -> T:
        return render(self._lookup(*args))

    def _lookup(
        self, query: str, overrides: dict[str, Any], filters: MetadataFilters | None, arrived: float
    ) -> LookupResult:
        limit = self.base.settings.retrieval.lookup_timeout_s
        # One deadline per request, from its arrival: the wait for a worker is part of it, and the lookup gets what
        # is left (every Milvus call and the freshness check are bounded by it).
        deadline = Deadline(arrived + limit)
        if deadline.expired:
            raise WorkerWaitError(
                f"no worker was free within the request's deadline ({limit:g} s, KB_LOOKUP_TIMEOUT_S): not looked "
                "up; retry shortly"
            )
        # Milvus known down (the last lookup could not search it): one lookup at a time probes it, the others fail
        # at once instead of each spending its whole deadline on a Milvus that does not answer.
        probing = time.monotonic() < self._down_until
        if probing and not self._probe.acquire(blocking=False):
            raise MilvusDownError(
                "Milvus did not answer the last lookup (knowledge_base_unavailable): not looked up while another "
                "lookup checks whether it is back; retry shortly"
            )
        try:
            result = self.variant(overrides).lookup(query, filters=filters, deadline=deadline)
        finally:
            if probing:
                self._probe.release()
        down = result.evidence_status.value == "knowledge_base_unavailable"
        self._down_until = time.monotonic() + FAIL_FAST_S if down else 0.0
        return result

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the pool, admitted like a lookup (health checks and trace reads use it too)."""
        with self.admitted():
            return await self._on_pool(fn, *args)

    async def _on_pool(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    def close(self) -> None:
        """Wait for the lookups already running or queued, then stop the threads (their trace rows are accepted)."""
        self.pool.shutdown(wait=True)
