"""Runs the sidecar retriever beside a lookup, on its own thread, with a deadline; its outcome is a status.

The core's protocol (:mod:`kb_retrieval.sidecar_protocol`) implemented: :class:`SidecarRunner` is a
``SidecarRunnerProtocol``, created by the core as ``load_runner("sidecar.runner:SidecarRunner", settings,
embed_model)`` when ``sidecar_enabled`` is set; :class:`SidecarJob` is a ``SidecarJobProtocol`` and
:class:`~sidecar.models.SidecarRun` a ``SidecarRunProtocol``. The core never imports this package otherwise.

How waiting works (one rule): a job's deadline is ``sidecar_timeout_s`` after it starts, and it starts at the very
beginning of ``KnowledgeLookup.lookup_ranked``. At the end of the lookup, :meth:`SidecarJob.collect` waits for
whatever is left of that deadline and no longer. So the two paths overlap, and a lookup with the sidecar on takes
``max(main, min(sidecar, timeout))`` rather than ``main + sidecar``: when the main path is the slower one the sidecar
costs nothing, and a slow or hung sidecar delays the answer by at most ``sidecar_timeout_s`` minus the main path's
own time. The trace row can then record the sidecar's outcome beside the lookup's. Keep ``KB_SIDECAR_TIMEOUT_S``
small wherever lookup latency matters more than comparison coverage.

Nothing the sidecar does reaches the main result: initialisation errors (``unavailable``), exceptions (``failed``)
and missed deadlines (``timeout``) become a :class:`~sidecar.models.SidecarRun` with a reason. A timed-out thread
cannot be killed; it finishes in the background and its answer is dropped. At most ``max_in_flight`` such threads
exist at once: beyond that a new job is not started and reports ``unavailable`` (this bounds what a hung sidecar can
pile up).

The retriever is created on first use, on the sidecar thread (so its start-up never delays a lookup), and kept once
created; a failed creation is retried by the next job.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.schema import QueryBundle

from kb_retrieval.config import KBSettings
from kb_retrieval.indexing.embeddings import embed_query
from kb_retrieval.models import ScoreLabel
from sidecar.comparable import from_sidecar_nodes
from sidecar.models import SidecarRun, SidecarStatus

if TYPE_CHECKING:
    from kb_retrieval.sidecar_protocol import SidecarJobProtocol, SidecarRunnerProtocol

log = logging.getLogger(__name__)

#: Sidecar threads allowed to run at once (including timed-out ones still finishing).
MAX_IN_FLIGHT = 4
RetrieverFactory = Callable[[], BaseRetriever]


class SidecarJob:
    """One sidecar retrieval, from its start at the beginning of a lookup until it is settled (exactly once)."""

    def __init__(self, query: str, timeout_s: float, score_label: str) -> None:
        self.query = query
        self.timeout_s = timeout_s
        self.score_label = score_label
        self.started = time.perf_counter()
        self.deadline = self.started + timeout_s
        self.phase = "starting"
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._run: SidecarRun | None = None

    def settle(self, run: SidecarRun) -> bool:
        """Record the outcome unless one is recorded already (a late answer after a timeout is dropped)."""
        with self._lock:
            if self._run is not None:
                return False
            self._run = run
            self._done.set()
            return True

    def outcome(self, status: SidecarStatus, reason: str | None, **fields: Any) -> SidecarRun:
        """A run of this job with the given status, timed from the job's start until now."""
        elapsed_ms = round((time.perf_counter() - self.started) * 1000, 3)
        return SidecarRun(status=status, reason=reason, score_label=self.score_label, elapsed_ms=elapsed_ms, **fields)

    def collect(self) -> SidecarRun:
        """Wait for what is left of the deadline; a job still running then is settled as ``timeout``."""
        waited_from = time.perf_counter()
        self._done.wait(max(0.0, self.deadline - time.perf_counter()))
        reason = f"no answer within {self.timeout_s:g} s (still {self.phase}); its answer will be dropped"
        self.settle(self.outcome("timeout", reason))
        assert self._run is not None  # settled just above unless settled before
        return self._run.model_copy(update={"waited_ms": round((time.perf_counter() - waited_from) * 1000, 3)})


class SidecarRunner:
    """Starts sidecar jobs and collects them within their deadline. Thread-safe; one per ``KnowledgeLookup``.

    Example:
        >>> runner = SidecarRunner(settings, embed_model)  # doctest: +SKIP
        >>> job = runner.start("RedisMemoryHigh on cache-01")  # doctest: +SKIP
        >>> ...  # the main path runs meanwhile  # doctest: +SKIP
        >>> job.collect().status  # doctest: +SKIP
        'ok'

    Args:
        settings: The lookup's settings (collection, metric, ``top_k``, ``sidecar_timeout_s``).
        embed_model: The lookup's embedding model (queries are embedded through the pipeline's lock).
        factory: Builds the retriever; default :func:`sidecar.retriever.make_sidecar_retriever`. Tests inject
            slow, failing or hanging retrievers here.
        max_in_flight: Sidecar threads allowed at once.
    """

    def __init__(
        self,
        settings: KBSettings,
        embed_model: BaseEmbedding,
        *,
        factory: RetrieverFactory | None = None,
        max_in_flight: int = MAX_IN_FLIGHT,
    ) -> None:
        self.settings = settings
        self.embed_model = embed_model
        self.max_in_flight = max_in_flight
        self._factory = factory or self._stock_retriever
        self._retriever: BaseRetriever | None = None
        self._init_lock = threading.Lock()
        self._count_lock = threading.Lock()
        self._in_flight = 0

    @property
    def in_flight(self) -> int:
        """Sidecar threads still running (a hung one stays counted until it returns)."""
        return self._in_flight

    def start(self, query: str) -> SidecarJob:
        """Start one job on its own thread; returns at once. Collect it with :meth:`SidecarJob.collect`."""
        job = SidecarJob(
            query, self.settings.sidecar.timeout_s, ScoreLabel.for_metric(self.settings.schema_fields.metric).value
        )
        with self._count_lock:
            busy = self._in_flight >= self.max_in_flight
            if not busy:
                self._in_flight += 1
        if busy:
            reason = f"not started: {self.max_in_flight} earlier sidecar runs are still running (hung?)"
            job.settle(job.outcome("unavailable", reason))
            return job
        try:
            # The caller's context: the sidecar's spans (its retrieve, its query embedding) sit under the lookup's.
            context = contextvars.copy_context()
            threading.Thread(target=context.run, args=(self._work, job), name="kb-sidecar", daemon=True).start()
        except Exception as exc:  # e.g. no thread can be started: the lookup goes on without its sidecar
            with self._count_lock:
                self._in_flight -= 1
            job.settle(job.outcome("unavailable", f"not started: {_describe(exc)}"))
        return job

    def run(self, query: str) -> SidecarRun:
        """Start and collect one job (the sidecar alone, without a lookup)."""
        return self.start(query).collect()

    # --- the sidecar thread -------------------------------------------------------------------------------

    def _work(self, job: SidecarJob) -> None:
        try:
            job.phase = "initialising"
            try:
                retriever = self._get_retriever()
            except Exception as exc:
                self._settle(job, "unavailable", f"cannot initialise the sidecar retriever: {_describe(exc)}")
                return
            try:
                job.phase = "embedding"
                bundle = QueryBundle(query_str=job.query, embedding=embed_query(self.embed_model, job.query))
                job.phase = "retrieving"
                nodes = retriever.retrieve(bundle)
                job.phase = "normalising"
                results = from_sidecar_nodes(nodes, self.settings)
            except Exception as exc:
                self._settle(job, "failed", f"{job.phase}: {_describe(exc)}")
                return
            job.settle(job.outcome("ok", None, results=results, chunk_count=len(nodes)))
        except BaseException as exc:  # never let anything escape a daemon thread unrecorded
            self._settle(job, "failed", f"{job.phase}: {_describe(exc)}")
        finally:
            with self._count_lock:
                self._in_flight -= 1

    def _settle(self, job: SidecarJob, status: SidecarStatus, reason: str) -> None:
        if job.settle(job.outcome(status, reason)):
            log.info("sidecar %s: %s", status, reason)

    def _get_retriever(self) -> BaseRetriever:
        with self._init_lock:
            if self._retriever is None:
                self._retriever = self._factory()
            return self._retriever

    def _stock_retriever(self) -> BaseRetriever:
        from sidecar.retriever import make_sidecar_retriever

        return make_sidecar_retriever(self.settings, self.embed_model)


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:500]}"


if TYPE_CHECKING:  # mypy checks that the sidecar implements the core's protocol
    _runner: type[SidecarRunnerProtocol] = SidecarRunner
    _job: type[SidecarJobProtocol] = SidecarJob
