"""What several ``kb-retrieval`` commands share: the check that a state dir holds a knowledge base, the name the
user ran the CLI by (for commands to copy), how a user error is printed, and what only the CLI's own process does
(its garbage collector during start-up)."""

from __future__ import annotations

import contextlib
import gc
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kb_retrieval.cli_args import CliError, mask_message
from kb_retrieval.reporting import display_path


def require_knowledge_base(settings: Any) -> None:
    """Stop with one line when the state dir holds no knowledge base (no Milvus Lite data dir, milvus.db): a
    mistyped ``--state-dir`` is said, not created empty."""
    if settings.storage.milvus_uri:
        return  # a Milvus server, or a Lite file named on purpose: connecting says what is wrong
    database = Path(settings.resolved_milvus_uri())
    if not database.exists():  # a file, or the data dir milvus-lite makes of it
        raise CliError(
            f"no knowledge base in {settings.storage.state_dir} ({database.name} not found): check --state-dir, or run "
            f"`{command_name()} ingest KB_DIR --state-dir {settings.storage.state_dir}` first"
        )


def command_name() -> str:
    """How the user ran this CLI, for commands to copy: ``.venv/bin/kb-retrieval`` after ``make demo``."""
    argv0 = sys.argv[0] if sys.argv else ""
    if Path(argv0).name == "kb-retrieval" and os.sep in argv0:
        return display_path(argv0)
    return "kb-retrieval"


def user_error(message: str) -> int:
    """Print a user error as one line (secrets masked) on stderr; its exit status, 2."""
    print(f"error: {mask_message(message)}", file=sys.stderr)
    return 2


_own_process = False


def claim_process() -> None:
    """Called by :func:`~kb_retrieval.cli.run.main` run as the process's command (the ``kb-retrieval`` script,
    ``python -m kb_retrieval.cli``): what :func:`own_process` tells."""
    global _own_process
    _own_process = True


def own_process() -> bool:
    """True in the ``kb-retrieval`` command's own process; False where a program, notebook or test calls ``main``
    (its environment, imports and garbage collector are its own)."""
    return _own_process


#: What a command that looks up sets in its own process when the user has not (before numpy is imported): one
#: OpenBLAS thread. Its pool (a thread per core) spins after each matrix product beside the query encoder's threads:
#: on 10k chunks a warm lookup's embedding took ~1.5 ms longer and the process ~40% more CPU with it
#: (docs/measurements.md), and starting it cost a cold lookup more than it saved. A user's own value is kept.
LOOKUP_ENVIRONMENT = {"OPENBLAS_NUM_THREADS": "1"}


def set_lookup_environment() -> None:
    """:data:`LOOKUP_ENVIRONMENT` in the command's own process (:func:`own_process`), the user's values kept; a
    process that calls ``main`` keeps its environment."""
    if own_process():
        for name, value in LOOKUP_ENVIRONMENT.items():
            os.environ.setdefault(name, value)


@contextlib.contextmanager
def start_up_gc() -> Iterator[None]:
    """Around a command's imports and set-up in the CLI's own process: no cyclic garbage collection while they run
    (importing LlamaIndex, pymilvus and pydantic models makes hundreds of thousands of objects that all live on, and
    each collection walks them for nothing), then those objects frozen (``gc.freeze``: later collections skip them)
    and collection back on. Elsewhere (:func:`own_process` False, or collection already off) it changes nothing."""
    if not own_process() or not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.enable()
