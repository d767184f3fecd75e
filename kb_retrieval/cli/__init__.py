"""``kb-retrieval``: ingest, stats, lookup, serve, traces, fixtures record, eval, compare, golden draft, bench, demo.

One module per command (``ingest.py`` ... ``demo.py``: its options, ``add_parser``, and its body, ``run``); the
parser in ``parser.py``, the process set-up and the one-line errors in ``run.py``, what commands share in
``common.py`` (and, for commands of other packages too, :mod:`kb_retrieval.cli_args`).

Every command honours ``--state-dir`` / ``KB_STATE_DIR``; flags override ``KB_*`` environment settings.
Heavy modules load only in the commands that need them, so ``kb-retrieval eval`` stays service-free.

Exit status: 0 done; 1 nothing to do or a check failed (an ingest that found no document, ``eval --fail-under``);
2 a user error (bad argument, input or setting, unreachable Milvus, a damaged, read-only or full state dir), printed
as one line with secrets masked and never a traceback; 3 ``serve`` cannot listen on its address (the port is in
use); 130 interrupted; 141 the reader of the output went away (``| head``), like a command ended by SIGPIPE.
"""

from __future__ import annotations

from kb_retrieval.cli.parser import build_parser
from kb_retrieval.cli.run import main

__all__ = ["build_parser", "main"]
