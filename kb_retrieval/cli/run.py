"""``kb-retrieval``'s main: the process set up (offline models, a private umask), the command run, and every error
caused by input or environment told in one line (exit status 2), never a traceback."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence

from kb_retrieval.cli.common import claim_process, user_error
from kb_retrieval.cli.parser import build_parser
from kb_retrieval.cli_args import CliError, describe_environment_error, describe_settings_error
from kb_retrieval.log_format import _MaskingFormatter


def _first_line_only(record: logging.LogRecord) -> bool:
    """A log filter: the record's message cut to its first line (what failed, without the traceback after it)."""
    text = record.getMessage()
    if "\n" in text:
        record.msg, record.args = text.split("\n", 1)[0], ()
    return True


#: What the command-line process sets for itself before any model library is imported (the library never touches
#: the environment): offline Hugging Face, and no tokenizer thread pools to fork.
CLI_ENVIRONMENT = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
#: Bits the command-line process adds to its umask: no group or other access to anything it creates.
PRIVATE_UMASK = 0o077


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command ``argv`` (default: ``sys.argv[1:]``) names; its exit status (the package docstring lists
    them)."""
    if argv is None:  # the command line of the process: the CLI's own process (its console script, -m)
        claim_process()
    for name, value in CLI_ENVIRONMENT.items():
        os.environ.setdefault(name, value)
    # What the commands write (the Milvus Lite files, written as late as a first load; traces; snapshots) holds the
    # knowledge base and its queries: the owner's only, whatever umask the shell has (000 included).
    umask = os.umask(PRIVATE_UMASK)
    os.umask(umask | PRIVATE_UMASK)
    try:
        return _run(list(sys.argv[1:] if argv is None else argv))
    finally:
        os.umask(umask)  # called in process (tests, notebooks): the caller's umask back


def _run(argv: list[str]) -> int:
    args = build_parser(next((a for a in argv if not a.startswith("-")), None)).parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING)
    for handler in logging.getLogger().handlers:
        handler.setFormatter(_MaskingFormatter(args.verbose))
    if not args.verbose:  # pymilvus writes the traceback into the message text of its RPC errors
        logging.getLogger("pymilvus.decorators").addFilter(_first_line_only)
    try:
        return int(args.func(args))
    except CliError as exc:
        return user_error(str(exc))
    except BrokenPipeError:
        _discard_stdout()
        return 141
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        message = _user_error_message(exc)
        if message is None:
            raise
        return user_error(message)


def _user_error_message(exc: Exception) -> str | None:
    """The one line to print for an error caused by input or environment, or None for a bug (a traceback)."""
    from pydantic import ValidationError

    from kb_retrieval.knowledge.loader import KnowledgeBaseError

    if isinstance(exc, ValidationError) and exc.title in ("KBSettings", "Settings"):
        return describe_settings_error(exc)
    if type(exc).__name__ == "SettingsError":  # pydantic-settings could not parse a variable (not JSON)
        return describe_environment_error(exc)
    names = {
        "MilvusUnavailableError",
        "MilvusLiteLockedError",
        "SchemaMismatchError",
        "EmptyQueryError",
        "GoldenCaseError",
        "FixtureError",
        "TraceStoreError",
        "LiteDataError",
    }
    if isinstance(exc, KnowledgeBaseError | ValidationError) or type(exc).__name__ in names:
        return str(exc)
    if type(exc).__name__ == "MilvusException":  # Milvus refused a call (a full disk under Lite, a server error)
        from kb_retrieval.indexing.milvus import describe_milvus_error

        return describe_milvus_error(exc)
    if isinstance(exc, OSError):  # a path that cannot be created or read, a permission, a full disk
        return f"{exc.strerror or type(exc).__name__}: {exc.filename}" if exc.filename else str(exc)
    return None


def _discard_stdout() -> None:
    """Point stdout at /dev/null: the reader is gone, and the interpreter's final flush must not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no real file descriptor (captured output): nothing left to flush to
        pass
