"""Run ``kb-retrieval`` (its ``main``) and SIGKILL the process at an injected point, like a power cut would.

    python -m tests.reliability.crash_driver --kill-at POINT -- ingest KB --state-dir DIR

POINT is one of:

* ``upsert:N``        right after the N-th write of chunks to Milvus returned
* ``before-delete:N`` right before the N-th delete of chunks
* ``l0-replace``      with the new L0 index written to its temporary file, before it replaces the old one
* ``after-write:S``   S seconds after the first write of chunks began (a timer, wherever the run is then)

SIGKILL gives the process no chance to clean up: no ``finally``, no ``atexit``, no flush.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from typing import Any


def _die() -> None:
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def install(point: str) -> None:
    from pymilvus import MilvusClient

    name, _, arg = point.partition(":")
    counts = {"upsert": 0, "delete": 0}
    real_upsert, real_delete, real_replace = MilvusClient.upsert, MilvusClient.delete, os.replace

    def upsert(self: MilvusClient, *args: Any, **kwargs: Any) -> Any:
        if name == "after-write" and counts["upsert"] == 0:
            threading.Timer(float(arg), _die).start()
        result = real_upsert(self, *args, **kwargs)
        counts["upsert"] += 1
        if name == "upsert" and counts["upsert"] == int(arg):
            _die()
        return result

    def delete(self: MilvusClient, *args: Any, **kwargs: Any) -> Any:
        counts["delete"] += 1
        if name == "before-delete" and counts["delete"] == int(arg):
            _die()
        return real_delete(self, *args, **kwargs)

    def replace(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
        if name == "l0-replace" and str(dst).endswith(".json") and os.sep + "l0" + os.sep in str(dst):
            _die()
        real_replace(src, dst, *args, **kwargs)

    MilvusClient.upsert = upsert  # type: ignore[method-assign]
    MilvusClient.delete = delete  # type: ignore[method-assign]
    os.replace = replace


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kill-at", required=True)
    parser.add_argument("argv", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    install(args.kill_at)
    from kb_retrieval.cli import main as cli_main

    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    code = cli_main(argv)
    print(f"crash_driver: the run ended (exit {code}) before reaching {args.kill_at}", file=sys.stderr)
    sys.exit(3)


if __name__ == "__main__":
    main()
