"""Secrets in URLs and text, masked: the one masking function of the project (commands, log lines, the trace store's
errors) and how a URL's secrets are found (its user-info password, secret query parameters), parsed, not guessed.

Example:
    >>> mask_url("mysql+pymysql://kb:hunter2@db/traces")
    'mysql+pymysql://kb:***@db/traces'
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, unquote, urlsplit, urlunsplit

__all__ = ["MASK", "SECRET_PARAMETERS", "checked_url", "mask_secrets", "mask_url", "url_secrets"]

#: A URL in free text (up to whitespace or a quote); its parts are found by parsing, not by one pattern.
_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[^\s'\"<>]+")
#: Query parameters whose values are secrets (matched without case, ``-`` and ``_``; also any name ending in one).
SECRET_PARAMETERS = (
    "password",
    "passwd",
    "pwd",
    "pass",
    "token",
    "secret",
    "apikey",
    "accesskey",
    "auth",
    "sslpassword",
)
MASK = "***"


def _secret_parameter(name: str) -> bool:
    key = name.lower().replace("_", "").replace("-", "")
    return any(key == s or key.endswith(s) for s in SECRET_PARAMETERS)


def url_secrets(url: str) -> list[str]:
    """The secrets a URL carries, parsed: its user-info password and the values of its secret query parameters
    (``password``, ``token``, ``secret``, ``api_key``, ...), each as written and percent-decoded. A password may
    hold spaces: ``url`` is the whole setting, not a token cut from text.

    Example:
        >>> url_secrets("postgresql://kb:my pass@db/traces?sslmode=require&api_key=k%2F1")
        ['my pass', 'k/1', 'k%2F1']
    """
    try:
        parts = urlsplit(url.strip())
    except ValueError:
        return []
    found: list[str] = []
    userinfo, at, _ = parts.netloc.rpartition("@")
    if at and ":" in userinfo:
        found.append(userinfo.split(":", 1)[1])
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if value and _secret_parameter(unquote(name)):
            found.append(value)
    for raw in re.findall(r"[?&]([^=&#]+)=([^&#]*)", parts.query):
        if raw[1] and _secret_parameter(unquote(raw[0])):
            found.append(raw[1])
    return [s for s in dict.fromkeys(found + [unquote(s) for s in found]) if s]


def mask_url(url: str) -> str:
    """``url`` with its user-info password and secret query parameter values replaced by ``***``.

    Example:
        >>> mask_url("postgresql+psycopg://kb@127.0.0.1:5432/db?password=hunter2&sslmode=require")
        'postgresql+psycopg://kb@127.0.0.1:5432/db?password=***&sslmode=require'
        >>> mask_url("sqlite:////var/lib/kb/traces.db")
        'sqlite:////var/lib/kb/traces.db'
    """
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    userinfo, at, host = parts.netloc.rpartition("@")
    netloc = parts.netloc
    if at and ":" in userinfo:
        netloc = f"{userinfo.split(':', 1)[0]}:{MASK}@{host}"
    query = "&".join(
        f"{name}={MASK}" if value and _secret_parameter(unquote(name)) else f"{name}{eq}{value}"
        for name, eq, value in (item.partition("=") for item in parts.query.split("&"))
    )
    if (netloc, query) == (parts.netloc, parts.query):
        return url  # nothing secret: the URL as given
    masked = urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
    if not parts.netloc and url[len(parts.scheme) + 1 :].startswith("//"):
        # urlunsplit drops an empty authority's "//": sqlite:///x.db (relative) would read sqlite:/x.db, and
        # sqlite:////abs/x.db (absolute) sqlite://abs/x.db, a host named "abs".
        masked = f"{parts.scheme}://{masked[len(parts.scheme) + 1 :]}"
    return masked


def mask_secrets(text: str, secrets: list[str] | tuple[str, ...] = ()) -> str:
    """``text`` with every URL's secrets (parsed: :func:`mask_url`) and every given secret value replaced by ``***``.

    The one masking function of the project: commands, log lines and the trace store's errors all go through it.

    Example:
        >>> mask_secrets("cannot reach http://root:hunter2@db:19530 (token abc:xyz)", ["abc:xyz"])
        'cannot reach http://root:***@db:19530 (token ***)'
    """
    for secret in sorted({s for s in secrets if len(s) >= 3}, key=len, reverse=True):
        text = text.replace(secret, MASK)
    return _URL_IN_TEXT.sub(lambda m: mask_url(m.group(0)), text)


def checked_url(value: str | None, *, host_required: bool) -> str | None:
    """``value`` when it is no URL or a URL whose host and port parse; raises ``ValueError`` otherwise.

    Checked here, once: a URL that does not parse fails later deep in a client library, with a traceback that can
    quote a piece of the password (urllib reads 'user:pa#ss@host' as host 'user', port 'pa').
    """
    if value and "://" in value:
        try:
            parts = urlsplit(value)
            parts.port  # noqa: B018 (parsing the port is the check)
        except ValueError:  # its message can quote a piece of the password: not repeated
            raise ValueError(
                "not a valid URL (its host or port does not parse); a character of the password such as "
                "# / ? @ [ must be percent-encoded (%23 %2F %3F %40 %5B)"
            ) from None
        if not parts.hostname and host_required:  # a database URL may name a socket instead
            raise ValueError(
                "not a valid URL: no host (a # / ? in the password ends it early: percent-encode them as %23 %2F %3F)"
            )
    return value
