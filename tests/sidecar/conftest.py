"""The ``make_lookup`` fixture: lookups over the sample KB with a real main path and a faked sidecar retriever."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest
from llama_index.core.base.base_retriever import BaseRetriever
from sidecar_fakes import FakeRetriever, SlowPath

from kb_retrieval.config import KBSettings
from kb_retrieval.engine import KnowledgeLookup
from kb_retrieval.indexing.milvus import connect
from kb_retrieval.retrieval.l1.sdk import SdkPath

MakeLookup = Callable[..., KnowledgeLookup]


@pytest.fixture
def make_lookup(sample_settings: KBSettings, embed_model) -> Iterator[MakeLookup]:
    """Builds lookups over the sample KB: ``make_lookup(sidecar=FakeRetriever(...) | None, main_delay=0.0, ...)``.

    ``sidecar=None`` leaves the sidecar off; a retriever switches it on and injects that retriever; a callable is
    used as the retriever factory (e.g. one that raises: the sidecar cannot initialise).
    """
    from sidecar.runner import SidecarRunner

    built: list[KnowledgeLookup] = []
    gates: list[threading.Event] = []

    def make(
        sidecar: BaseRetriever | Callable[[], BaseRetriever] | None = None,
        *,
        main_delay: float = 0.0,
        timeout_s: float = 3.0,
        max_in_flight: int = 4,
    ) -> KnowledgeLookup:
        settings = sample_settings.model_copy(
            update={"sidecar_enabled": sidecar is not None, "sidecar_timeout_s": timeout_s}
        )
        runner = None
        if sidecar is not None:
            factory = sidecar if not isinstance(sidecar, BaseRetriever) else (lambda: sidecar)
            runner = SidecarRunner(settings, embed_model, factory=factory, max_in_flight=max_in_flight)
            if isinstance(sidecar, FakeRetriever) and sidecar.gate is not None:
                gates.append(sidecar.gate)
        client = connect(settings)
        path = SlowPath(SdkPath(client, settings), main_delay) if main_delay else None
        # the runner is handed over through the core's protocol (kb_retrieval.sidecar_protocol), as any other runner
        lookup = KnowledgeLookup(settings, embed_model=embed_model, client=client, path=path, sidecar=runner)
        built.append(lookup)
        return lookup

    yield make
    for gate in gates:  # release hung sidecar threads
        gate.set()
    for lookup in built:
        lookup.close()
