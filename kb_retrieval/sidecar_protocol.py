"""The core's side of the sidecar: a comparison retriever run beside the main path (the ``sidecar`` package
implements it).

The core never imports the sidecar package: it knows only these protocols. A comparison runner is either handed
to :class:`~kb_retrieval.engine.KnowledgeLookup` (``sidecar=...``) or, when ``sidecar.enabled`` is set, created
from the dotted factory named by ``KBSettings.sidecar.factory`` (``"sidecar.runner:SidecarRunner"`` by default),
which is called as ``factory(settings, embed_model)``. Its run never changes the main result; the trace row
records :meth:`SidecarRunProtocol.trace_entry`.

Example:
    >>> entry = disabled_entry()
    >>> entry["status"]
    'disabled'
"""

from __future__ import annotations

import logging
from importlib import import_module
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from llama_index.core.base.embeddings.base import BaseEmbedding

    from kb_retrieval.config import KBSettings

log = logging.getLogger(__name__)

#: ``retrieval_details.sidecar`` of a lookup without a comparison run.
DISABLED_REASON = "sidecar not enabled (KB_SIDECAR_ENABLED=false)"


class SidecarRunProtocol(Protocol):
    """The settled outcome of one comparison retrieval."""

    def trace_entry(self) -> dict[str, Any]:
        """A compact, JSON-ready record for the trace row (status, reason, timings, top candidates)."""
        ...


class SidecarJobProtocol(Protocol):
    """One comparison retrieval started at the beginning of a lookup."""

    def collect(self) -> SidecarRunProtocol:
        """Wait (bounded by the runner's own deadline) and return the settled run."""
        ...


class SidecarRunnerProtocol(Protocol):
    """Starts a comparison retrieval for a query; never raises into the lookup."""

    def start(self, query: str) -> SidecarJobProtocol: ...


def disabled_entry() -> dict[str, Any]:
    """The trace entry of a lookup that ran no comparison."""
    return {"status": "disabled", "reason": DISABLED_REASON}


class UnavailableRun:
    """The run of a comparison runner that could not be created: status ``unavailable`` with the reason."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def trace_entry(self) -> dict[str, Any]:
        return {"status": "unavailable", "reason": self.reason}

    def collect(self) -> UnavailableRun:  # its own job: nothing to wait for
        return self


class UnavailableRunner:
    """Stands in for a runner whose factory failed: every job is ``unavailable``, the lookup runs as usual."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def start(self, query: str) -> UnavailableRun:
        return UnavailableRun(self.reason)


def load_runner(dotted: str, settings: KBSettings, embed_model: BaseEmbedding) -> SidecarRunnerProtocol:
    """Create the runner named ``"package.module:Factory"`` (imported only here, only when enabled).

    A factory that cannot be imported or called never fails the lookup's construction: the runner is then an
    :class:`UnavailableRunner` whose runs say why (status ``unavailable``, logged once here).
    """
    module_name, _, attr = dotted.partition(":")
    try:
        if not module_name or not attr:
            raise ValueError(f"sidecar_factory must look like 'package.module:Factory', got {dotted!r}")
        factory = getattr(import_module(module_name), attr)
        runner: SidecarRunnerProtocol = factory(settings, embed_model)
    except Exception as exc:
        reason = (
            f"sidecar_factory {dotted!r} cannot be loaded: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
        )
        log.warning("%s", reason)
        return UnavailableRunner(reason)
    return runner


if TYPE_CHECKING:  # mypy checks that the stand-in implements the protocols
    _runner: type[SidecarRunnerProtocol] = UnavailableRunner
    _job: type[SidecarJobProtocol] = UnavailableRun
    _run: type[SidecarRunProtocol] = UnavailableRun
