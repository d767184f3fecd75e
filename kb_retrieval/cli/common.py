"""What several ``kb-retrieval`` commands share: the check that a state dir holds a knowledge base, the name the
user ran the CLI by (for commands to copy), and how a user error is printed."""

from __future__ import annotations

import os
import sys
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
