"""``kb-retrieval serve``: one warm process (or ``--workers N``) for HTTP and MCP clients, Alertmanager and a
test page (:mod:`kb_retrieval.service.server`)."""

from __future__ import annotations

import argparse

from kb_retrieval.cli.common import set_lookup_environment, user_error
from kb_retrieval.cli_args import (
    CliError,
    add_lookup_arguments,
    describe_settings_error,
    positive_int,
    register_secret,
    require_extra,
    settings_from_args,
)

#: Modules of the ``serve`` extra that ``kb-retrieval serve`` needs.
SERVE_MODULES = ("fastapi", "uvicorn", "mcp")
#: ``serve``'s exit status when its address cannot be bound (uvicorn's own for a failed start-up, kept).
EXIT_ADDRESS_IN_USE = 3


def run(args: argparse.Namespace) -> int:
    """Serve until stopped; ``EXIT_ADDRESS_IN_USE`` when the address cannot be bound."""
    set_lookup_environment()  # before numpy is imported; the workers it starts inherit it
    require_extra("serve", SERVE_MODULES, "serve")
    from pydantic import ValidationError

    from kb_retrieval.service.server import AddressInUseError, ServeError, run_server
    from kb_retrieval.service.settings import ServeSettings

    flags = {"host": args.host, "port": args.port, "token": args.token, "workers": args.workers}
    try:
        serve = ServeSettings(**{k: v for k, v in flags.items() if v is not None})
    except ValidationError as error:
        names = {field: f"KB_SERVER_{field.upper()}" for field in ServeSettings.model_fields}
        raise CliError(describe_settings_error(error, names | {k: f"--{k}" for k, v in flags.items() if v})) from None
    register_secret(serve.token.get_secret_value())
    try:
        return run_server(settings_from_args(args), serve)
    except AddressInUseError as exc:
        user_error(str(exc))
        return EXIT_ADDRESS_IN_USE
    except ServeError as exc:
        raise CliError(str(exc)) from None


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser], command: str | None) -> None:
    """The ``serve`` command's options."""
    p = sub.add_parser("serve", help="one warm process for HTTP and MCP clients, Alertmanager and a test page")
    p.add_argument("--host", help="address to bind (KB_SERVER_HOST; default 127.0.0.1: other addresses need a token)")
    p.add_argument("--port", type=int, help="port (KB_SERVER_PORT; default 8765; 0: any free port)")
    p.add_argument(
        "--token",
        help="bearer token clients must send (KB_SERVER_TOKEN, preferred: a flag shows in the process list)",
    )
    p.add_argument(
        "--workers",
        type=positive_int,
        help="worker processes (KB_SERVER_WORKERS; default 1): lookups are CPU-bound, one process uses one core",
    )
    add_lookup_arguments(p)
    p.set_defaults(func=run)
