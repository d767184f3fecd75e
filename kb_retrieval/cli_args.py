"""What the ``kb-retrieval`` commands share: their common options, settings built from them, argument types, and
how a user error is told (one line, secrets masked).

Commands defined in other packages (``compare`` in ``sidecar``, ``eval`` in ``kb_retrieval.evaluation``) use these
too, so every command names a bad value the same way: by the flag that gave it or the ``KB_*`` environment variable.

Example:
    >>> parser = argparse.ArgumentParser()
    >>> add_lookup_arguments(parser)
    >>> settings = settings_from_args(parser.parse_args(["--state-dir", "/tmp/kb", "--mode", "sdk"]))
    >>> (str(settings.storage.state_dir), settings.retrieval.vector_store_mode)
    ('/tmp/kb', 'sdk')
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
from collections.abc import Sequence
from typing import Any

from pydantic import SecretStr, ValidationError

from kb_retrieval.config import KBSettings, mask_secrets
from kb_retrieval.settings import GROUPS, short_name

#: Command-line options that set a settings field: option dest -> (flag, field).
SETTINGS_FLAGS: dict[str, tuple[str, str]] = {
    "state_dir": ("--state-dir", "state_dir"),
    "uri": ("--uri", "milvus_uri"),
    "collection": ("--collection", "collection"),
    "mode": ("--mode", "vector_store_mode"),
    "batch_size": ("--batch-size", "embed_batch_size"),
    "threads": ("--threads", "embed_threads"),
}
#: KBSettings holding a URL: its password is masked where the URL parses, and a URL that does not parse is not shown.
_URL_FIELDS = frozenset({"milvus_uri", "trace_db_url"})
#: Secrets of the settings built in this process, masked in every message the CLI prints.
_SECRETS: set[str] = set()


class CliError(Exception):
    """A user-facing error: printed as one line (secrets masked), exit status 2."""


def add_location_arguments(parser: argparse.ArgumentParser) -> None:
    """``--state-dir``, ``--uri``, ``--collection``: where the index lives (each overrides its ``KB_*`` setting)."""
    parser.add_argument(
        "--state-dir",
        metavar="DIR",
        help="state directory: Milvus Lite data, traces (KB_STATE_DIR; default ./.kb-state)",
    )
    parser.add_argument(
        "--uri", help="Milvus URI: a local path (Milvus Lite) or http://host:port, a server (KB_MILVUS_URI)"
    )
    parser.add_argument(
        "--collection", metavar="NAME", help="Milvus collection name (KB_COLLECTION; default kb_chunks)"
    )


def add_lookup_arguments(parser: argparse.ArgumentParser) -> None:
    """The location options plus ``--mode``, the vector-store path of lookups."""
    add_location_arguments(parser)
    parser.add_argument(
        "--mode",
        choices=["auto", "vectorstore", "sdk", "spring-ai"],
        help="vector-store path: LlamaIndex MilvusVectorStore, pymilvus, or auto (the first, falling back to the "
        "second); spring-ai is an alias of vectorstore (KB_VECTOR_STORE_MODE; default auto)",
    )


def settings_from_args(args: argparse.Namespace, **updates: Any) -> KBSettings:
    """The settings: ``KB_*`` environment and defaults, overridden by the flags given and then by ``updates``.

    Raises:
        CliError: a setting is invalid; the message names the flag or environment variable, never a secret.
    """
    overrides: dict[str, Any] = {}
    flags: dict[str, str] = {}
    for dest, (flag, field) in SETTINGS_FLAGS.items():
        value = getattr(args, dest, None)
        if value is not None:
            overrides[field] = value
            flags[field] = flag
    overrides.update(updates)
    try:
        settings = KBSettings(**overrides)
    except ValidationError as error:
        raise CliError(describe_settings_error(error, flags)) from None
    _SECRETS.update(settings.secret_values())
    return settings


def register_secret(value: str) -> None:
    """Mask ``value`` (a token this process was given) in every message the CLI prints from now on."""
    if value:
        _SECRETS.add(value)


def describe_settings_error(error: ValidationError, flags: dict[str, str] | None = None) -> str:
    """One line per invalid setting, named by its flag (when one gave it) or its environment variable.

    The value is shown, except for secret fields; the whole line is masked besides.

    Example:
        >>> try:
        ...     KBSettings(metric="cosine2")
        ... except ValidationError as error:
        ...     print(describe_settings_error(error))
        invalid setting KB_METRIC='COSINE2': Input should be 'COSINE', 'IP' or 'L2'
    """
    flags = flags or {}
    problems = []
    for item in error.errors(include_url=False):
        loc = tuple(str(part) for part in item["loc"])
        message = str(item["msg"]).removeprefix("Value error, ")
        if not loc or loc in {(group,) for group in GROUPS}:  # a check across settings (chunk_overlap < chunk_tokens)
            problems.append(f"invalid settings: {message}")
            continue
        flat = short_name(*loc[:2]) if loc[0] in GROUPS else loc[0]
        name = flags.get(flat) or _variable(loc)
        secret = _is_secret(flat) or "token" in loc[-1].lower() or "password" in loc[-1].lower()
        shown = "" if secret or isinstance(item.get("input"), dict) else f"={item.get('input')!r}"
        problems.append(f"invalid setting {name}{shown}: {message}")
    return mask_message("; ".join(problems))


def _variable(loc: tuple[str, ...]) -> str:
    """The environment variable of the setting at ``loc``: its grouped name when that is the one set, else its flat
    short form (``KB_TOP_K``, as documented)."""
    if loc[0] not in GROUPS:
        return "KB_" + "__".join(loc).upper()
    full = "KB_" + "__".join(loc[:2]).upper()
    name = full if full in os.environ else "KB_" + short_name(*loc[:2]).upper()
    return "__".join([name, *loc[2:]]).upper()


def describe_environment_error(error: Exception) -> str:
    """pydantic-settings' error for a variable it could not even parse (``KB_INDEX_PARAMS='{not json'``) as one
    line naming the variable; the value is not shown (it may be a secret).

    Example:
        >>> describe_environment_error(ValueError('error parsing value for field "index_params" from source "X"'))
        'invalid setting KB_INDEX_PARAMS: cannot parse its value (JSON expected for a list or a mapping)'
    """
    found = re.search(r'field "([^"]+)"', str(error))
    if found is None:
        name = "a KB_* variable"
    else:  # a field the pipeline's settings do not have is the server's (KB_SERVER_*)
        name = ("KB_" if found.group(1) in KBSettings.setting_names() else "KB_SERVER_") + found.group(1).upper()
        name = f"KB_{found.group(1).upper()}__*" if found.group(1) in GROUPS else name
    cause = error.__cause__
    why = f": {cause.msg} at column {cause.colno}" if isinstance(cause, json.JSONDecodeError) else ""
    return mask_message(f"invalid setting {name}: cannot parse its value (JSON expected for a list or a mapping){why}")


def _is_secret(field: str) -> bool:
    if field in _URL_FIELDS:  # a password in a URL that does not parse cannot be found to be masked: never shown
        return True
    info = KBSettings.setting_field(field)
    return info is not None and info.annotation in (SecretStr, "SecretStr")


def mask_message(text: str) -> str:
    """``text`` with URL passwords and every known secret (settings built here, ``KB_MILVUS_TOKEN``) masked."""
    token = os.environ.get("KB_MILVUS_TOKEN", "")
    from_env = [token, token.split(":", 1)[-1]] if token else []
    return mask_secrets(text, [*_SECRETS, *from_env])


def positive_int(text: str) -> int:
    """argparse type: an integer of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def require_extra(extra: str, modules: Sequence[str], command: str) -> None:
    """Fail with one line naming the extra to install when a module ``command`` needs is missing."""
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError:
            raise CliError(
                f"`kb-retrieval {command}` needs the '{extra}' extra ({name} is not installed): "
                f"pip install 'kb-retrieval[{extra}]'"
            ) from None
