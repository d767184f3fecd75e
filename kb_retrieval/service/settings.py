"""The server's own settings (environment prefix ``KB_SERVER_``), apart from the pipeline's ``KBSettings``."""

from __future__ import annotations

import ipaddress
from typing import Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

#: Host names that mean this machine only (an address is checked with ``ipaddress``).
LOOPBACK_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost")


class ServeSettings(BaseSettings):
    """Where ``kb-retrieval serve`` listens and what it accepts. Flags of ``serve`` override these."""

    model_config = SettingsConfigDict(env_prefix="KB_SERVER_", extra="ignore", hide_input_in_errors=True)

    host: str = Field(
        default="127.0.0.1",
        description="Address to bind. Loopback by default; any other address needs a token (KB_SERVER_TOKEN).",
    )
    port: int = Field(default=8765, ge=0, le=65535, description="TCP port to listen on (0: any free port).")
    token: SecretStr = Field(
        default=SecretStr(""),
        description="Bearer token every API and MCP request must carry (Authorization: Bearer ...); required to bind "
        "a non-loopback address. Never printed; compared in constant time.",
    )
    max_body_bytes: int = Field(default=1_000_000, ge=1024, description="Largest request body accepted (413 above it).")
    max_alerts: int = Field(default=200, ge=1, description="Alerts one Alertmanager payload may carry at most (413).")
    max_alert_chars: int = Field(
        default=32_000,
        ge=1024,
        description="Characters of labels and annotations one alert of an Alertmanager payload may carry at most "
        "(413 naming the alert, before any lookup runs); the query made of it is cut at KB_MAX_QUERY_CHARS as any.",
    )
    max_pending: int = Field(
        default=256,
        ge=1,
        description="Lookups admitted at once (running on the pool or waiting for it); past it, 503 until one ends.",
    )
    max_overrides: int = Field(
        default=32, ge=1, description="Distinct setting-override sets whose pipelines are kept assembled."
    )
    access_log: bool = Field(
        default=True, description="One JSON line per request on stderr (logger kb_retrieval.access)."
    )
    allowed_hosts: str = Field(
        default="",
        description="Host names (comma-separated) a request's Host and Origin may name besides loopback ones: the "
        "names a reverse proxy forwards (kb.example.org). Set, it is checked on every bind; unset, a loopback bind "
        "answers loopback names only (DNS rebinding) and another bind relies on the token.",
    )
    graceful_shutdown_s: int = Field(
        default=10,
        ge=1,
        description="On SIGTERM, seconds the requests in flight get to finish before their connections are closed "
        "(the trace rows of the lookups answered are written either way).",
    )
    body_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="Seconds a client may take to send a request body (408 past it): a slow sender holds no slot.",
    )

    http: Literal["auto", "httptools", "h11"] = Field(
        default="auto",
        description="uvicorn's HTTP/1.1 parser. auto: httptools when installed (the serve extra installs it), else "
        "the pure-Python h11; the start-up line says which.",
    )
    loop: Literal["auto", "uvloop", "asyncio"] = Field(
        default="auto",
        description="The event loop. auto: uvloop when installed (the serve extra installs it, not on Windows), "
        "else asyncio's own; the start-up line says which.",
    )

    workers: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Worker processes answering on the one address (a lookup is CPU work under the GIL: one process "
        "uses one core). Each holds its own pipeline and memory mirror (~500 MB on a few thousand chunks); on Milvus "
        "Lite the serve process holds the data dir and serves it to them.",
    )

    @field_validator("token")
    @classmethod
    def _not_blank(cls, value: SecretStr) -> SecretStr:
        secret = value.get_secret_value()
        if secret and not secret.strip():
            raise ValueError("is only whitespace: no secret at all (leave it unset, or set a real token)")
        if secret != secret.strip():
            raise ValueError("starts or ends with whitespace (a client's 'Authorization: Bearer' would never match)")
        return value

    def allowed_host_names(self) -> frozenset[str]:
        """``allowed_hosts`` as lower-case names (ports and blanks dropped), with the bound address when it is one
        address (a client of ``--host 10.0.0.5`` says ``Host: 10.0.0.5``)."""
        names = {split_host(part.strip())[0] for part in self.allowed_hosts.split(",")}
        if self.checks_host() and self.host.strip("[]") not in ("0.0.0.0", "::"):
            names.add(self.host.strip().strip("[]").lower())
        return frozenset(name for name in names if name)

    def checks_host(self) -> bool:
        """Whether Host and Origin are checked: on a loopback bind always, on another one when names are allowed."""
        return is_loopback(self.host) or bool(self.allowed_hosts.strip(", "))


def split_host(value: str) -> tuple[str, str]:
    """A Host header (or ``host[:port]``) as ``(lower-case name, port)``; IPv6 without its brackets.

    Example:
        >>> split_host("[::1]:8765"), split_host("Kb.Example.org"), split_host("127.0.0.2:80")
        (('::1', '8765'), ('kb.example.org', ''), ('127.0.0.2', '80'))
    """
    value = value.strip().lower()
    if value.startswith("["):
        name, _, rest = value[1:].partition("]")
        return name, rest.removeprefix(":")
    if value.count(":") == 1:
        name, _, port = value.partition(":")
        return name, port
    return value, ""


def is_loopback(host: str) -> bool:
    """True when ``host`` names this machine only (127.0.0.0/8, ::1, localhost).

    Example:
        >>> is_loopback("127.0.0.1"), is_loopback("::1"), is_loopback("0.0.0.0"), is_loopback("10.0.0.5")
        (True, True, False, False)
    """
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
