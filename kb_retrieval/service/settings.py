"""The server's own settings (environment prefix ``KB_SERVER_``), apart from the pipeline's ``KBSettings``."""

from __future__ import annotations

import ipaddress

from pydantic import Field, SecretStr
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
