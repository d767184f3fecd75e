"""``kb-retrieval lookup`` in a fresh process, as a person runs it, reporting the heavy modules it loaded: a lookup
answered through a server must load none of them (the point of it: a process start and one round trip).

Example:
    >>> run = lookup_in_fresh_process(["--server", url, "--json", "RedisMemoryHigh"])  # doctest: +SKIP
    >>> json.loads(run.stdout)["evidenceBlocks"][0]["source"]  # doctest: +SKIP
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from tests.support.kb import offline_env

REPO = Path(__file__).resolve().parents[2]
#: Modules a client through a server must never load.
HEAVY = ("llama_index", "torch", "pymilvus", "milvus_lite", "onnxruntime", "sqlalchemy", "fastapi", "mcp", "numpy")


def cli_env() -> dict[str, str]:
    """This process's environment, offline, with the repo on the path and no server or state dir of its own."""
    env = {k: v for k, v in os.environ.items() if k not in ("KB_SERVER_URL", "KB_SERVER_TOKEN", "KB_STATE_DIR")}
    return offline_env(env, PYTHONPATH=str(REPO))


def lookup_in_fresh_process(
    args: Sequence[str], env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``kb-retrieval lookup *args`` (through ``kb_retrieval.cli.main``) in a new Python process (``env``, by
    default :func:`cli_env`) and check it exited 0 having loaded none of :data:`HEAVY`; return the run (its stdout
    is the lookup's)."""
    probe = (
        "import sys\n"
        "from kb_retrieval.cli import main\n"
        f"code = main(['lookup', *{list(args)!r}])\n"
        f"heavy = sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r}))\n"
        "print('HEAVY', code, heavy, file=sys.stderr)\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env=dict(cli_env() if env is None else env),
    )
    assert "HEAVY 0 []" in run.stderr, run.stderr
    return run
