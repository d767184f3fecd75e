"""A real Milvus standalone server for the bench and the tests, started through the venv's ``milvus-server`` script.

Size: over 400 lines: one class that starts, watches and stops a Milvus server process (ports, locks, logs)
for the bench and the tests.

``kb-retrieval bench`` measures scale on it (unless ``KB_BENCH_MILVUS_URI`` names a server to use); the test suite
starts one per session (``tests/support/fixtures.py``). Both stop it with its whole process tree.

The PyPI package ``milvus`` (2.3.5) ships ``milvus-server``: a small Python wrapper that writes
``DATA/configs/milvus.yaml``, unpacks the Milvus binary into ``DATA/bin`` and runs ``milvus run standalone``
as its child. Facts this module rests on (checked on this machine):

* Ports. The wrapper's flags set the proxy (the client port), proxy-internal, coordinator and node gRPC ports
  and the etcd client *endpoint*; we pick free ports for all of them. The embedded etcd, however, listens on
  etcd's defaults (127.0.0.1:2379 and :2380) whatever ``--etcd-port`` says, so we hand Milvus an etcd config
  file through ``ETCD_CONFIG_PATH`` with our own client and peer ports. The metrics/health HTTP port is chosen
  by the wrapper (the first free one from 9091 up, as ``METRICS_PORT``) and cannot be set: we read it back
  from the child's environment. Storage is local files and the queue rocksmq: no MinIO, Pulsar or NATS port.
  Milvus listens on all interfaces (``:PORT``) except etcd (loopback); with ``<role>.ip=127.0.0.1`` its
  components at least register and dial each other on loopback, not on the machine's first address.
* A port taken between our pick and Milvus's bind: Milvus quietly moves that component to a random port.
  Harmless for internal ones; for the proxy, start-up notices and retries on fresh ports.
* Stopping. SIGTERM to the wrapper kills only the wrapper: its child ``milvus run standalone`` lives on. So
  ``stop()`` sends SIGTERM to the Milvus process itself (a graceful stop takes about 2 s), then SIGINT to the
  wrapper, whose handler reaps the exited child (no zombie handed to PID 1), then kills what is left of the
  wrapper's process group and checks, by PID and by command line, that nothing is left.
* Restarting on the same data dir keeps collections and rows (rocksmq replays what was not flushed). A
  stopped server leaves its sessions in etcd and a restart waits for their leases to run out, so the lease
  TTL is lowered to 10 s; the ports are kept (``uri`` stays valid) even while they are in TIME_WAIT.
* The wrapper unpacks ~250 MB of binaries into each data dir (~4 s): ``DATA/bin`` is instead a symlink to one
  shared, version-keyed cache (``~/.cache/kb-retrieval/milvus-VERSION/bin``, or ``KB_TEST_MILVUS_BIN_CACHE``).

Starts are serialised across processes with a file lock, so two helpers on one machine do not pick the same
ports (the wrapper's own metrics-port probe included).
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import importlib.metadata
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import weakref
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import IO

import psutil

#: The wrapper's port flags, each with the milvus.yaml key it fills and that key's value form. A port held
#: only by closed connections in TIME_WAIT (right after a stop) fails the wrapper's plain-bind probe, while
#: Milvus (Go, SO_REUSEADDR) can listen on it: such a port goes through ``--extra-config KEY=VALUE`` instead
#: of its flag, so a restart keeps its ports and its uri.
PORT_FLAGS: dict[str, tuple[str, str]] = {
    "proxy-port": ("proxy.port", "{}"),
    "proxy-internal-port": ("proxy.internalPort", "{}"),
    "etcd-port": ("etcd.endpoints", "localhost:{}"),
    "root-coord-port": ("rootCoord.port", "{}"),
    "query-coord-port": ("queryCoord.port", "{}"),
    "query-node-port": ("queryNode.port", "{}"),
    "index-coord-port": ("indexCoord.bindIndexNodeMode.address", "localhost:{}"),
    "index-node-port": ("indexNode.port", "{}"),
    "data-coord-port": ("dataCoord.port", "{}"),
    "data-node-port": ("dataNode.port", "{}"),
}
#: Not a wrapper flag: the embedded etcd's peer port, set through ETCD_CONFIG_PATH.
ETCD_PEER = "etcd-peer-port"
#: Components that would otherwise register (and dial each other on) the machine's first non-loopback address.
LOOPBACK_ROLES = ("rootCoord", "proxy", "queryCoord", "queryNode", "indexNode", "dataCoord", "dataNode")
#: Seconds of Milvus's etcd session leases (30 by default). A stopped server leaves its coordinators' sessions
#: in etcd, and a restart waits for those leases to run out, counted from the restart (seen: ~55 s at 30).
DEFAULT_SESSION_TTL = 10
#: On SIGTERM the query node waits up to queryNode.gracefulStopTimeout (30 s by default) for its segments to
#: move to another query node; a standalone server has none, and its coordinators are already stopped by then.
#: Not in the wrapper's template, so it goes through Milvus's environment-variable config source.
QUERY_NODE_GRACEFUL_STOP_SECONDS = 2

_LOCK_FILE = Path(tempfile.gettempdir()) / "kb-retrieval-milvus-start.lock"
_RUNNING: weakref.WeakSet[MilvusServer] = weakref.WeakSet()
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never via http_proxy


@atexit.register
def _stop_servers_left_running() -> None:
    """Last resort, should a test run end without its fixtures' teardown: no orphaned Milvus."""
    for server in list(_RUNNING):
        with contextlib.suppress(Exception):
            server.stop(verify=False)


class MilvusServerError(RuntimeError):
    """The server did not start, or did not stop cleanly."""


class _DiedDuringStartup(MilvusServerError):
    """The wrapper or Milvus exited before answering (a port taken meanwhile, say): worth one more try."""


def find_milvus_server_executable() -> str:
    """The ``milvus-server`` script of the running interpreter's environment (else the one on PATH)."""
    candidate = Path(sys.executable).parent / "milvus-server"
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return str(candidate)
    found = shutil.which("milvus-server")
    if found:
        return found
    raise MilvusServerError(
        "milvus-server not found next to the interpreter or on PATH: install the dev extras "
        "(pip install -e '.[dev]', which brings the PyPI package 'milvus')"
    )


def _ephemeral_port_floor() -> int:
    try:
        low = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0]
        return int(low)
    except (OSError, ValueError, IndexError):
        return 32768


def port_state(port: int) -> str:
    """``"free"``, ``"time_wait"`` or ``"busy"``, on every interface and on loopback.

    ``"time_wait"``: only closed connections still hold the port. A listener that sets SO_REUSEADDR (Milvus
    and its etcd, both Go) can bind it; the wrapper's own probe (a plain bind) cannot.
    """
    for reuse, verdict in ((False, "free"), (True, "time_wait")):
        ok = True
        for host in ("", "127.0.0.1"):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                if reuse:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    sock.bind((host, port))
                except OSError:
                    ok = False
                    break
        if ok:
            return verdict
    return "busy"


def pick_free_ports(count: int, *, exclude: set[int] | None = None) -> list[int]:
    """``count`` distinct free TCP ports below the kernel's ephemeral range.

    Staying below the ephemeral range means an outgoing connection cannot take one of them between the pick
    and the server's bind (a port from ``bind(0)`` could).
    """
    high = min(_ephemeral_port_floor(), 65536) - 1
    low = 20000 if high > 21000 else 1024
    excluded = set(exclude or ())
    ports: list[int] = []
    rng = random.Random()
    for _ in range(20000):
        port = rng.randint(low, high)
        if port in excluded or port in ports or port in (9091, 2379, 2380, 19530):
            continue
        if port_state(port) == "free":
            ports.append(port)
            if len(ports) == count:
                return ports
    raise MilvusServerError(f"could not find {count} free ports in {low}-{high}")


@contextlib.contextmanager
def _start_lock() -> Iterator[None]:
    with open(_LOCK_FILE, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _alive(proc: psutil.Process) -> bool:
    """Running, as opposed to gone or a zombie (exited, not yet reaped)."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False


def _listening_ports(proc: psutil.Process) -> set[int]:
    try:
        return {c.laddr.port for c in proc.net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN}
    except psutil.Error:
        return set()


def _tail(path: Path, lines: int, width: int = 400) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError as exc:
        return f"({path}: {exc})"
    return "\n".join(line[:width] for line in text[-lines:])


class MilvusServer:
    """One Milvus standalone server on one data dir, startable and stoppable any number of times.

    >>> with MilvusServer(tmp_dir) as server:  # doctest: +SKIP
    ...     MilvusClient(server.uri).list_collections()

    ``stop()`` then ``start()`` on the same object reuses the data dir (so collections and rows survive) and,
    when they are still free, the same ports (so ``uri`` stays the same).
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str] | None = None,
        *,
        startup_timeout: float = 120.0,
        stop_timeout: float = 30.0,
        share_binaries: bool = True,
        session_ttl: int = DEFAULT_SESSION_TTL,
        executable: str | None = None,
    ) -> None:
        self._owns_data_dir = data_dir is None
        self.data_dir = Path(data_dir or tempfile.mkdtemp(prefix="kb-milvus-")).resolve()
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self.share_binaries = share_binaries
        self.session_ttl = session_ttl
        self.executable = executable or find_milvus_server_executable()
        self.ports: dict[str, int] = {}
        self.metrics_port: int | None = None
        self.startup_seconds: float | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._wrapper_log: IO[bytes] | None = None
        self._known: dict[int, psutil.Process] = {}
        #: Every PID that belonged to the last run (wrapper and descendants); kept after stop() for checks.
        self.pids: set[int] = set()

    # ----------------------------------------------------------------------------------------- properties

    @property
    def proxy_port(self) -> int:
        if "proxy-port" not in self.ports:
            raise MilvusServerError("the server has not been started")
        return self.ports["proxy-port"]

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.proxy_port}"

    @property
    def log_dir(self) -> Path:
        return self.data_dir / "logs"

    @property
    def wrapper_log_path(self) -> Path:
        return self.data_dir / "milvus-server-wrapper.log"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        """PID of the ``milvus-server`` wrapper (the Milvus process is its child)."""
        return self._proc.pid if self._proc is not None else None

    # ----------------------------------------------------------------------------------------- lifecycle

    def __enter__(self) -> MilvusServer:
        if not self.running:
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
        if self._owns_data_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def start(self) -> MilvusServer:
        """Start, and wait until ``MilvusClient(uri).list_collections()`` answers.

        Up to three tries, with new ports, when the server dies during start-up (a port taken meanwhile).
        """
        if self.running:
            raise MilvusServerError(f"already running (wrapper pid {self.pid})")
        began = time.monotonic()
        with _start_lock():
            attempts = 3
            for attempt in range(1, attempts + 1):
                self._choose_ports(fresh=attempt > 1)
                self._launch()
                try:
                    self._wait_ready(began)
                except _DiedDuringStartup:
                    self.stop(verify=False)
                    if attempt == attempts or time.monotonic() - began > self.startup_timeout:
                        raise
                    continue
                except BaseException:
                    self.stop(verify=False)
                    raise
                self.startup_seconds = time.monotonic() - began
                _RUNNING.add(self)
                return self
        raise AssertionError("unreachable")

    def stop(self, *, verify: bool = True) -> None:
        """End the whole process tree: Milvus gracefully (SIGTERM), then the wrapper, then any leftover.

        With ``verify`` (the default), raise if any process of this server is still running afterwards.
        """
        proc = self._proc
        if proc is not None:
            self._refresh_tree()
            wrapper_pid = proc.pid
            children = [p for pid, p in self._known.items() if pid != wrapper_pid and _alive(p)]
            for child in children:
                with contextlib.suppress(psutil.NoSuchProcess):
                    child.send_signal(signal.SIGTERM)
            self._wait_until_dead(children, self.stop_timeout)
            for child in children:
                if _alive(child):
                    with contextlib.suppress(psutil.NoSuchProcess):
                        child.kill()
            # SIGINT makes the wrapper reap its (now exited) child and leave; SIGTERM would orphan a zombie.
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)
            # The wrapper ran in its own session and process group: sweep it.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(wrapper_pid, signal.SIGKILL)
            self._wait_until_dead(list(self._known.values()), 10)
            self._proc = None
        if self._wrapper_log is not None:
            self._wrapper_log.close()
            self._wrapper_log = None
        self._known.clear()
        _RUNNING.discard(self)
        if verify:
            left = self.leftover_processes()
            if left:
                described = ", ".join(f"{p.pid} {self._describe(p)}" for p in left)
                raise MilvusServerError(f"Milvus server processes still running after stop: {described}")

    def restart(self) -> MilvusServer:
        self.stop()
        return self.start()

    # ----------------------------------------------------------------------------------------- inspection

    def process_tree(self) -> list[psutil.Process]:
        """The wrapper and its descendants that are running now."""
        self._refresh_tree()
        return [p for p in self._known.values() if _alive(p)]

    def rss_bytes(self) -> int:
        """Resident memory of the wrapper plus the Milvus process."""
        total = 0
        for proc in self.process_tree():
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                total += proc.memory_info().rss
        return total

    def leftover_processes(self) -> list[psutil.Process]:
        """Running processes of this server: by the PIDs of its last run, and by a command line naming its
        data dir (the wrapper's ``--data DIR``, the Milvus binary ``DIR/bin/milvus``)."""
        found: dict[int, psutil.Process] = {}
        for pid in self.pids:
            try:
                proc = psutil.Process(pid)
            except psutil.NoSuchProcess:
                continue
            if _alive(proc):
                found[pid] = proc
        marker = str(self.data_dir)
        for proc in psutil.process_iter(["cmdline"]):
            cmdline = proc.info.get("cmdline") or []
            if proc.pid != os.getpid() and any(marker in part for part in cmdline) and _alive(proc):
                found[proc.pid] = proc
        return list(found.values())

    def log_tail(self, lines: int = 40) -> str:
        parts = []
        for path in (
            self.wrapper_log_path,
            self.log_dir / "milvus-stderr.log",
            self.log_dir / "milvus-stdout.log",
        ):
            if path.exists():
                parts.append(f"--- {path} (last {lines} lines)\n{_tail(path, lines)}")
        return "\n".join(parts) or f"(no logs under {self.data_dir})"

    # ----------------------------------------------------------------------------------------- internals

    def _choose_ports(self, *, fresh: bool) -> None:
        names = [*PORT_FLAGS, ETCD_PEER]
        if not fresh and self.ports and all(port_state(self.ports[name]) != "busy" for name in names):
            return  # same ports as the last run: the uri stays valid across a restart
        self.ports = dict(zip(names, pick_free_ports(len(names)), strict=True))

    def _prepare_data_dir(self) -> Path:
        configs = self.data_dir / "configs"
        configs.mkdir(parents=True, exist_ok=True)
        bin_dir = self.data_dir / "bin"
        if self.share_binaries and not bin_dir.exists() and not bin_dir.is_symlink():
            version = importlib.metadata.version("milvus")
            cache = Path(
                os.environ.get("KB_TEST_MILVUS_BIN_CACHE")
                or Path.home() / ".cache" / "kb-retrieval" / f"milvus-{version}" / "bin"
            )
            cache.mkdir(parents=True, exist_ok=True)
            bin_dir.symlink_to(cache, target_is_directory=True)
        client, peer = self.ports["etcd-port"], self.ports[ETCD_PEER]
        etcd_config = configs / "embed-etcd.yaml"
        etcd_config.write_text(
            "name: default\n"
            f"listen-client-urls: http://127.0.0.1:{client}\n"
            f"advertise-client-urls: http://127.0.0.1:{client}\n"
            f"listen-peer-urls: http://127.0.0.1:{peer}\n"
            f"initial-advertise-peer-urls: http://127.0.0.1:{peer}\n"
            f"initial-cluster: default=http://127.0.0.1:{peer}\n"
        )
        return etcd_config

    def _launch(self) -> None:
        etcd_config = self._prepare_data_dir()
        command = [self.executable, "--data", str(self.data_dir)]
        for flag, (key, form) in PORT_FLAGS.items():
            port = self.ports[flag]
            if port_state(port) == "free":
                command += [f"--{flag}", str(port)]
            else:  # in TIME_WAIT after a stop: past the wrapper's probe, straight into milvus.yaml
                command += ["--extra-config", f"{key}={form.format(port)}"]
        for role in LOOPBACK_ROLES:
            command += ["--extra-config", f"{role}.ip=127.0.0.1"]
        command += ["--extra-config", f"common.session.ttl={self.session_ttl}"]
        env = dict(os.environ)
        env["ETCD_CONFIG_PATH"] = str(etcd_config)
        env["QUERYNODE_GRACEFULSTOPTIMEOUT"] = str(QUERY_NODE_GRACEFUL_STOP_SECONDS)
        log = open(self.wrapper_log_path, "ab")  # noqa: SIM115 - closed in stop()
        log.write(f"\n=== {time.strftime('%F %T')} {' '.join(command)}\n".encode())
        log.flush()
        self._wrapper_log = log
        self._proc = subprocess.Popen(
            command,
            cwd=self.data_dir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.pids = {self._proc.pid}
        self._known = {self._proc.pid: psutil.Process(self._proc.pid)}
        self.metrics_port = None

    def _refresh_tree(self) -> None:
        if self._proc is None:
            return
        try:
            root = psutil.Process(self._proc.pid)
            for child in root.children(recursive=True):
                self._known.setdefault(child.pid, child)
        except psutil.NoSuchProcess:
            pass
        self.pids.update(self._known)

    def _milvus_process(self) -> psutil.Process | None:
        wrapper_pid = self.pid
        for pid, proc in self._known.items():
            if pid != wrapper_pid:
                return proc
        return None

    def _wait_ready(self, began: float) -> None:
        """Ready: Milvus's /healthz says OK (every component up), the proxy listens on *our* port, and
        ``MilvusClient(uri).list_collections()`` answers.

        Milvus quietly moves a component to a random port when its configured one is taken (by someone else,
        between our pick and its bind): harmless for internal ports, but a proxy moved elsewhere would leave
        ``uri`` pointing at the intruder, so that counts as a failed start and is retried on fresh ports.
        """
        from pymilvus import MilvusClient  # imported late: pymilvus is slow to import

        deadline = began + self.startup_timeout
        last_problem = "no Milvus process yet"
        while True:
            self._refresh_tree()
            if not self.running:
                raise self._failure("milvus-server exited during start-up", died=True)
            milvus = self._milvus_process()
            if milvus is not None and not _alive(milvus):
                raise self._failure("the 'milvus run standalone' process exited during start-up", died=True)
            if milvus is not None and self.metrics_port is None:
                with contextlib.suppress(psutil.Error, ValueError):
                    self.metrics_port = int(milvus.environ().get("METRICS_PORT", "0")) or None
            if milvus is not None and self.metrics_port is not None:
                if not self._healthy():
                    last_problem = f"http://127.0.0.1:{self.metrics_port}/healthz not OK yet"
                else:
                    listening = _listening_ports(milvus)
                    if self.proxy_port not in listening:
                        raise self._failure(
                            f"Milvus is healthy but its proxy does not listen on port {self.proxy_port} (taken "
                            f"meanwhile?); it listens on {sorted(listening)}",
                            died=True,
                        )
                    client = None
                    try:
                        client = MilvusClient(uri=self.uri, timeout=5)
                        client.list_collections()
                        return
                    except Exception as exc:  # any failure just means "not ready yet"
                        last_problem = f"{type(exc).__name__}: {exc}"
                    finally:
                        if client is not None:
                            with contextlib.suppress(Exception):
                                client.close()
            if time.monotonic() > deadline:
                raise self._failure(f"not ready within {self.startup_timeout:.0f} s (last problem: {last_problem})")
            time.sleep(0.5)

    def _healthy(self) -> bool:
        url = f"http://127.0.0.1:{self.metrics_port}/healthz"
        try:
            with _NO_PROXY.open(url, timeout=2) as response:
                return b"OK" in response.read()
        except (OSError, ValueError):
            return False

    def _failure(self, what: str, *, died: bool = False) -> MilvusServerError:
        ports = " ".join(f"{name}={port}" for name, port in self.ports.items())
        kind = _DiedDuringStartup if died else MilvusServerError
        return kind(f"Milvus server on {self.data_dir}: {what}\nports: {ports}\n{self.log_tail()}")

    @staticmethod
    def _wait_until_dead(procs: list[psutil.Process], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while any(_alive(p) for p in procs) and time.monotonic() < deadline:
            time.sleep(0.1)

    @staticmethod
    def _describe(proc: psutil.Process) -> str:
        try:
            return " ".join(proc.cmdline()) or proc.name()
        except psutil.Error:
            return "?"
