"""The CLI's log line style, shared by the CLI and the serve workers (kept apart so workers need not import the CLI)."""

from __future__ import annotations

import logging

from kb_retrieval.cli_args import mask_message


class _MaskingFormatter(logging.Formatter):
    """Log lines (tracebacks included) with URL passwords and known secrets masked, in the CLI's one style:
    ``warning: ...`` / ``error: ...`` like the CLI's own messages (the logger's name only with ``--verbose``).
    Without ``--verbose``, the libraries' records (Milvus Lite, pymilvus: a failed load logs the same traceback
    three times) are one line each: the command's own ``error:`` line says what happened and what to do."""

    def __init__(self, verbose: bool = False) -> None:
        super().__init__("%(levelname)s %(name)s: %(message)s" if verbose else "%(message)s")
        self.verbose = verbose

    def format(self, record: logging.LogRecord) -> str:
        if not self.verbose and record.exc_info and not record.name.startswith("kb_retrieval"):
            record = logging.makeLogRecord({**record.__dict__, "exc_info": None, "exc_text": None})
        text = super().format(record)
        if not self.verbose and record.levelno >= logging.WARNING:
            text = f"{record.levelname.lower()}: {text}"
        return mask_message(text)
