"""Processes the reliability tests start, freeze and stop: a ``milvus-lite server`` and SIGSTOP/SIGCONT.

Example:
    >>> with lite_server(tmp_path / "shared.db") as server:  # doctest: +SKIP
    ...     with frozen(server.processes()):
    ...         ...  # connections open, nothing answers
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil

from tests.support.milvus_server import pick_free_ports


@contextlib.contextmanager
def frozen(processes: Iterable[psutil.Process]) -> Iterator[None]:
    """Stop ``processes`` (SIGSTOP: their sockets stay open, nothing answers) until the block ends, then resume."""
    stopped = list(processes)
    for proc in stopped:
        proc.send_signal(signal.SIGSTOP)
    try:
        yield
    finally:
        for proc in stopped:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.send_signal(signal.SIGCONT)


@dataclass
class LiteServer:
    """A running ``milvus-lite server`` (gRPC on a loopback port)."""

    proc: subprocess.Popen[str]
    uri: str

    def processes(self) -> list[psutil.Process]:
        root = psutil.Process(self.proc.pid)
        return [root, *root.children(recursive=True)]


@contextlib.contextmanager
def lite_server(data_dir: Path) -> Iterator[LiteServer]:
    """``milvus-lite server`` on ``data_dir``, loopback only, as the README documents; stopped with Ctrl-C."""
    (port,) = pick_free_ports(1)
    command = [str(Path(sys.executable).parent / "milvus-lite"), "server", "--data-dir", str(data_dir)]
    command += ["--host", "127.0.0.1", "--port", str(port)]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "listening on 127.0.0.1" in line, line
        yield LiteServer(proc, f"http://127.0.0.1:{port}")
    finally:
        proc.send_signal(signal.SIGINT)  # Ctrl-C: it closes the data dir
        try:
            proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:  # SIGINT ignored (inherited, as in a background job): end it anyway
            proc.kill()
            proc.communicate(timeout=15)
