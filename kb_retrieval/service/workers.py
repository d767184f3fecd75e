"""``kb-retrieval serve --workers N``: N worker processes behind one listening socket, so lookups use every core.

A lookup is CPU work under the GIL (threads in one process gave 1.13-1.17x one thread), so the server scales with
processes. The process started as ``serve`` is the supervisor:

* it binds the address once (the workers accept on that one socket: the kernel hands each connection to one of
  them, and an idle worker's event loop takes it first);
* on Milvus Lite it opens the data dir itself (Lite opens a dir in one process only: the lock, and so
  ``kb-retrieval lookup``'s server discovery, name the supervisor) and serves it to the workers on Lite's loopback
  gRPC port, the one a Lite client in process already uses; on a Milvus server every worker connects itself;
* it starts the workers (fresh processes, ``spawn``), the first alone: it reads the collection, builds the memory
  plan's mirror and writes the state snapshot (and the trace table), then the others start and read the snapshot.
  Each worker has its own pipeline and mirror; a lookup makes no Milvus call on the memory plan (the freshness check,
  document sections not yet cached and ``/healthz`` go to the supervisor's Lite);
* it writes ``serve.json`` once every worker listens, restarts a worker that dies (at most one start per worker in
  ``RESTART_GAP_S``), and on SIGTERM or Ctrl-C sends each worker SIGTERM once: each answers its requests in flight
  (``KB_SERVER_GRACEFUL_SHUTDOWN_S``), writes its trace rows and ends; then the data dir is let go.

Trace rows: every worker writes its own rows to the one trace database; SQLite in WAL mode with a busy timeout
(``KB_TRACE_TIMEOUT_S``) takes writers from several processes (PostgreSQL and MySQL do anyway). A worker whose
supervisor is gone (SIGKILL) stops within a second; the workers run in their own process group, so a terminal's
Ctrl-C reaches the supervisor only and each worker is told once.

Example:
    >>> run_workers(KBSettings(state_dir=".kb-state/demo"), ServeSettings(workers=2))  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import socket
import sys
import threading
import time
from multiprocessing.synchronize import Event
from types import FrameType
from typing import TYPE_CHECKING, Any

from kb_retrieval.config import KBSettings
from kb_retrieval.service import discovery
from kb_retrieval.service.serving import configure_access_log, http_stack, listening_url, make_server, settle_heap
from kb_retrieval.service.settings import ServeSettings

if TYPE_CHECKING:
    from multiprocessing.context import SpawnProcess

#: A worker that died is started again at most once per this many seconds (a worker that cannot start at all is not
#: restarted in a tight loop).
RESTART_GAP_S = 5.0
#: How often the supervisor looks at its workers, and a worker at its supervisor.
WATCH_S = 1.0


class WorkerStartError(RuntimeError):
    """A worker ended before it listened (its own error line is on stderr before this one)."""


def listening_socket(serve: ServeSettings) -> socket.socket:
    """The one socket every worker accepts on: bound (``SO_REUSEADDR``, as uvicorn binds) and listening."""
    host = serve.host.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, serve.port))
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def served_lite_uri(settings: KBSettings) -> str:
    """Open the Milvus Lite data dir in this process (the checks and modes of any open) and the loopback URI of the
    gRPC server Lite runs for it here, which the workers connect to."""
    from milvus_lite.server_manager import server_manager_instance

    from kb_retrieval.indexing.milvus import connect

    connect(settings).list_collections()  # the dir opened here: one clear line when another process holds it
    uri = server_manager_instance.start_and_get_uri(settings.resolved_milvus_uri())
    if not uri:
        raise WorkerStartError(f"Milvus Lite did not serve {settings.resolved_milvus_uri()} to the workers")
    return uri


class _Worker:
    """One worker process and what the supervisor knows of it."""

    def __init__(self, number: int) -> None:
        self.number = number
        self.process: SpawnProcess | None = None
        self.ready: Event | None = None
        self.started_at = 0.0

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.is_alive()

    def start(self, args: tuple[Any, ...]) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.ready = ctx.Event()
        self.process = ctx.Process(
            target=worker_main, args=(*args, self.ready, self.number), name=f"kb-serve-worker-{self.number}"
        )
        self.started_at = time.monotonic()
        self.process.start()

    def wait_ready(self, stopping: threading.Event) -> None:
        assert self.ready is not None and self.process is not None
        while not self.ready.wait(0.2):
            if stopping.is_set():
                return
            if not self.process.is_alive():
                raise WorkerStartError(
                    f"serve worker {self.number} ended at start-up (exit status {self.process.exitcode}); its error "
                    "is above"
                )

    def stop(self) -> None:
        if self.process is not None and self.process.is_alive() and self.process.pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, signal.SIGTERM)

    def join(self, timeout_s: float) -> None:
        if self.process is None:
            return
        self.process.join(timeout_s)
        if self.process.is_alive():
            print(f"kb-retrieval serve: worker {self.number} did not stop in time: killed", file=sys.stderr, flush=True)
            self.process.kill()
            self.process.join(10)


def run_workers(settings: KBSettings, serve: ServeSettings) -> int:
    """Serve with ``serve.workers`` processes until SIGTERM / SIGINT; 0 on a clean stop. Raises ``OSError`` when the
    address cannot be bound, ``WorkerStartError`` when a worker cannot start (its reason printed by it)."""
    sock = listening_socket(serve)
    stopping = threading.Event()

    def stop(signum: int, frame: FrameType | None) -> None:
        stopping.set()

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    workers = [_Worker(number) for number in range(serve.workers)]
    lite = not settings.is_milvus_server()
    try:
        lite_uri = served_lite_uri(settings) if lite else None
        args = (settings, serve, sock, lite_uri, os.getpid())
        # The first worker alone: it writes the state snapshot and the trace table the others then read.
        workers[0].start(args)
        workers[0].wait_ready(stopping)
        for worker in workers[1:]:
            worker.start(args)
        for worker in workers[1:]:
            worker.wait_ready(stopping)
        if not stopping.is_set():
            _announce(sock, serve, settings)
        while not stopping.wait(WATCH_S):
            for worker in workers:
                if not worker.alive and time.monotonic() - worker.started_at >= RESTART_GAP_S:
                    code = worker.process.exitcode if worker.process is not None else None
                    print(
                        f"kb-retrieval serve: worker {worker.number} ended (exit status {code}): starting it again",
                        file=sys.stderr,
                        flush=True,
                    )
                    worker.start(args)
    finally:
        for worker in workers:
            worker.stop()
        for worker in workers:
            worker.join(serve.graceful_shutdown_s + 60.0)  # the requests in flight, then the trace rows
        discovery.withdraw(settings)
        if lite:
            from kb_retrieval.indexing.milvus import release_lite

            release_lite(settings)
        sock.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    print("kb-retrieval serve stopped (every worker wrote its trace rows)", file=sys.stderr, flush=True)
    return 0


def _announce(sock: socket.socket, serve: ServeSettings, settings: KBSettings) -> None:
    url, shown = listening_url(sock.getsockname())
    print(
        f"kb-retrieval serve: listening on {shown} with {serve.workers} worker processes (collection "
        f"{settings.storage.collection}; page /, API /v1/lookup, MCP /mcp; HTTP {http_stack(serve)}"
        f"{'; token required' if serve.token.get_secret_value() else ''})",
        file=sys.stderr,
        flush=True,
    )
    discovery.announce(settings, url, token_required=bool(serve.token.get_secret_value()))


# --- in a worker -----------------------------------------------------------------------------------------------


def worker_main(
    settings: KBSettings,
    serve: ServeSettings,
    sock: socket.socket,
    lite_uri: str | None,
    supervisor: int,
    ready: Event,
    number: int,
) -> None:
    """A worker: its own lookup (on the supervisor's Lite when ``lite_uri``), the app, uvicorn on ``sock``."""
    os.setpgid(0, 0)  # a terminal's Ctrl-C reaches the supervisor only; it tells each worker once
    _worker_logging(serve, number)
    from kb_retrieval.engine import KnowledgeLookup
    from kb_retrieval.service.app import create_app
    from kb_retrieval.traces import TraceStore

    configure_access_log(serve)

    _share_cores(serve.workers)
    try:
        client = _lite_client(lite_uri, settings) if lite_uri else None
        lookup = KnowledgeLookup(settings, client=client, trace_store=TraceStore.from_settings(settings))
    except Exception as exc:
        text = str(exc).strip().splitlines()
        print(
            f"kb-retrieval serve worker {number}: error: {settings.mask(text[0] if text else type(exc).__name__)}",
            file=sys.stderr,
            flush=True,
        )
        raise SystemExit(2) from None
    try:
        app = create_app(lookup, serve)
        settle_heap()
        server = make_server(app, serve)
        original = server.startup

        async def startup(sockets: list[Any] | None = None) -> None:
            await original(sockets=sockets)
            ready.set()

        server.startup = startup  # type: ignore[method-assign]
        threading.Thread(target=_watch_supervisor, args=(supervisor, server), daemon=True).start()
        # uvicorn raises the signal it stopped on again once done: a no-op here, so the rows below get written.
        signal.signal(signal.SIGTERM, lambda signum, frame: None)
        server.run(sockets=[sock])
    finally:
        lookup.close()
        if lookup.traces.failures:
            print(
                f"kb-retrieval serve worker {number}: {lookup.traces.failures} trace rows not recorded",
                file=sys.stderr,
                flush=True,
            )


def _share_cores(workers: int) -> None:
    """The query encoder's onnxruntime threads: the cores shared among the workers (two workers on two cores, one
    thread each), not every core in every worker (their pools would take cores from each other)."""
    from kb_retrieval.indexing import onnx_query

    # Measured at 16 clients (2 cores, shared machine): two workers of two threads each 19.8-21.8 requests/s, no more
    # than one worker (19.9-22.7); of one thread each 32.8-46.6.
    onnx_query.DEFAULT_THREADS = min(onnx_query.DEFAULT_THREADS, max(1, (os.cpu_count() or 1) // workers))


def _lite_client(uri: str, settings: KBSettings) -> Any:
    from pymilvus import MilvusClient

    from kb_retrieval.indexing.milvus import LITE_GRPC_OPTIONS

    return MilvusClient(uri=uri, timeout=settings.storage.milvus_timeout_s, grpc_options=dict(LITE_GRPC_OPTIONS))


def _watch_supervisor(supervisor: int, server: Any) -> None:
    """Stop this worker when its supervisor is gone (killed): nobody would stop or restart it any more."""
    while not server.should_exit:
        if os.getppid() != supervisor:
            server.should_exit = True
            return
        time.sleep(WATCH_S)


def _worker_logging(serve: ServeSettings, number: int) -> None:
    """The CLI's log style in the worker (a spawned process starts with none): one line per record, secrets masked."""
    from kb_retrieval.cli_args import register_secret
    from kb_retrieval.log_format import _MaskingFormatter

    register_secret(serve.token.get_secret_value())
    logging.basicConfig(level=logging.WARNING)
    for handler in logging.getLogger().handlers:
        handler.setFormatter(_MaskingFormatter(False))
    logging.getLogger("kb_retrieval").debug("serve worker %d started", number)
