"""Stage 3c: small-to-big. Chunks are retrieved and ranked; the evidence is the document they belong to.

After dedupe each node stands for one document. :class:`DocumentExpander` attaches that document's sections in
document order, marking the ones retrieval matched (with their hit reasons), so the agent can be given the whole
runbook (its Diagnosis and Mitigation, not only the chunk that resembled the alert) as the budget allows; the
context pack decides how much of each document fits.

The sections come from Milvus (one query for the documents not cached yet, restricted to the version the candidate
came from) and are cached by ``(source, doc_hash)``: a document's rows never change under one hash. On the memory plan
the mirror already holds every row with the fields a section is made of, so they come from it instead, with no Milvus
call (:meth:`SectionStore.over`); Milvus still gives the documents the mirror does not hold (a candidate of a search
only Milvus could serve, of a version newer than the mirror).

Example:
    >>> expander = DocumentExpander(sections=SectionStore(client, settings))  # doctest: +SKIP
    >>> nodes = expander.postprocess_nodes(deduped_nodes)  # doctest: +SKIP
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections import OrderedDict
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.schema import NodeWithScore, QueryBundle
from pydantic import Field, PrivateAttr
from pymilvus import MilvusClient

from kb_retrieval.config import KBSettings
from kb_retrieval.indexing.milvus import rows_where
from kb_retrieval.models import DocumentSection
from kb_retrieval.retrieval.filters import in_expr
from kb_retrieval.retrieval.hybrid import LookupQuery
from kb_retrieval.retrieval.runtime import note_limitation
from kb_retrieval.retrieval.stage import HitKind, StageData, hit_reason, stage_of, write_stage

if TYPE_CHECKING:
    from kb_retrieval.retrieval.l1.memory import MemoryMirror

log = logging.getLogger(__name__)


class SectionStore:
    """A document's sections from Milvus, by ``(source, doc_hash)``, with a bounded LRU cache. Thread-safe."""

    def __init__(self, client: MilvusClient, settings: KBSettings, max_documents: int = 2048) -> None:
        self.client = client
        self.settings = settings
        self.max_documents = max_documents
        self._cache: OrderedDict[tuple[str, str], list[DocumentSection]] = OrderedDict()
        self._lock = threading.Lock()
        #: The store reading each mirror (:meth:`over`), kept while the mirror is (a reload builds a new mirror).
        self._mirrored: weakref.WeakKeyDictionary[MemoryMirror, SectionStore] = weakref.WeakKeyDictionary()

    def sections(self, keys: list[tuple[str, str]], timeout: float | None = None) -> dict[tuple[str, str], list[Any]]:
        """Sections (unmarked) of each ``(source, doc_hash)``; a document Milvus no longer holds is left out."""
        found: dict[tuple[str, str], list[Any]] = {}
        with self._lock:
            for key in keys:
                if key in self._cache:
                    self._cache.move_to_end(key)
                    found[key] = self._cache[key]
        missing = [k for k in dict.fromkeys(keys) if k not in found]
        if missing:
            fetched = self._fetch(missing, timeout)
            with self._lock:
                for key, sections in fetched.items():
                    self._cache[key] = sections
                    self._cache.move_to_end(key)
                while len(self._cache) > self.max_documents:
                    self._cache.popitem(last=False)
            found.update(fetched)
        return found

    def over(self, mirror: MemoryMirror | None) -> SectionStore:
        """The store a pipeline reads sections from: with the memory plan's ``mirror`` (``L1Retriever.mirror_for``),
        one reading that mirror's rows (the same for every pipeline over it, so its cache is shared), this one for what
        the mirror does not hold; without, this one. The one place that decides where sections come from."""
        if mirror is None:
            return self
        with self._lock:
            if (store := self._mirrored.get(mirror)) is None:
                store = self._mirrored[mirror] = MirrorSectionStore(mirror, self)
        return store

    def _fetch(self, keys: list[tuple[str, str]], timeout: float | None) -> dict[tuple[str, str], list[Any]]:
        s = self.settings
        rows = rows_where(
            self.client,
            s,
            in_expr(s.schema_fields.source_field, sorted({source for source, _ in keys})),
            [s.schema_fields.source_field, s.schema_fields.content_field, s.schema_fields.metadata_field],
            timeout=timeout or s.storage.milvus_search_timeout_s,
        )
        return document_sections(rows, s, keys)


class MirrorSectionStore(SectionStore):
    """On the memory plan: a document's sections from the mirror's rows (every row, with its source, content and
    metadata), cached as :class:`SectionStore` caches them; a document the mirror does not hold comes from ``milvus``.
    Built by :meth:`SectionStore.over`."""

    def __init__(self, mirror: MemoryMirror, milvus: SectionStore) -> None:
        super().__init__(milvus.client, milvus.settings, milvus.max_documents)
        self.mirror = mirror
        self.milvus = milvus

    def _fetch(self, keys: list[tuple[str, str]], timeout: float | None) -> dict[tuple[str, str], list[Any]]:
        sources = sorted({source for source, _ in keys})
        found = document_sections(
            self.mirror.rows_holding(self.settings.schema_fields.source_field, sources), self.settings, keys
        )
        if rest := [key for key in keys if key not in found]:
            found.update(self.milvus.sections(rest, timeout))
        return found


def document_sections(
    rows: Iterable[dict[str, Any]], settings: KBSettings, keys: list[tuple[str, str]]
) -> dict[tuple[str, str], list[DocumentSection]]:
    """The sections of each ``(source, doc_hash)`` of ``keys`` among ``rows`` (a source's rows, from Milvus or the
    mirror), in position order; a row without a position is no section."""
    fields = settings.schema_fields
    wanted = set(keys)
    by_doc: dict[tuple[str, str], list[DocumentSection]] = {}
    for row in rows:
        meta = row.get(fields.metadata_field) or {}
        key = (str(row.get(fields.source_field)), str(meta.get("doc_hash")))
        if key in wanted and isinstance(meta.get("position"), int):
            by_doc.setdefault(key, []).append(
                DocumentSection(
                    breadcrumb=meta.get("breadcrumb"),
                    content=row.get(fields.content_field) or "",
                    position=meta["position"],
                )
            )
    return {key: sorted(sections, key=lambda x: x.position) for key, sections in by_doc.items()}


class DocumentExpander(BaseNodePostprocessor):
    """Attach each document node's sections in order, matched ones marked; other nodes pass through unchanged."""

    max_documents: int = Field(default=5, ge=0, description="Expand at most this many nodes, best first.")
    _sections: SectionStore | None = PrivateAttr(default=None)

    def __init__(self, *, sections: SectionStore | None = None, **data: Any) -> None:
        super().__init__(**data)
        self._sections = sections

    @classmethod
    def class_name(cls) -> str:
        return "DocumentExpander"

    @classmethod
    def from_lookup(cls, lookup: Any, config: dict[str, Any] | None = None, **fields: Any) -> DocumentExpander:
        """An expander with ``lookup``'s configuration (or ``config``, a ``to_dict()``) reading its section store.
        ``fields``: other fields (e.g. ``callback_manager``). The one way the pipeline builds its expander."""
        state = {"sections": lookup.sections, **fields}
        if config is not None:
            return cls.from_dict(config, **state)
        s = lookup.settings
        return cls(max_documents=s.evidence.max_evidence_blocks if s.retrieval.expand_documents else 0, **state)

    @property
    def sections(self) -> SectionStore | None:
        """Where sections come from (runtime state, given when built; not configuration)."""
        return self._sections

    def _postprocess_nodes(
        self, nodes: list[NodeWithScore], query_bundle: QueryBundle | None = None
    ) -> list[NodeWithScore]:
        if self.max_documents == 0 or not nodes:
            return nodes
        if self.sections is None:
            message = "no section store attached (see from_lookup): the chunks stand as evidence"
            note_limitation(log, self.class_name(), "no_sections", message, [(n, stage_of(n)) for n in nodes])
            return nodes
        staged = [(node, stage_of(node)) for node in nodes[: self.max_documents]]
        keys = [_key(stage) for _, stage in staged]
        wanted = [key for key in keys if key is not None]
        if not wanted:
            return nodes
        deadline = query_bundle.deadline if isinstance(query_bundle, LookupQuery) else None
        try:
            if deadline is not None and deadline.expired:
                return nodes  # no time left: the chunks stand as evidence
            timeout = deadline.timeout(self.sections.settings.storage.milvus_search_timeout_s) if deadline else None
            documents = self.sections.sections(wanted, timeout)
        except Exception as exc:  # the chunks still stand as evidence
            log.warning("fetching document sections failed: %s", exc)
            for node, stage in staged:
                stage.notes.append(f"{self.class_name()}: fetching the document's sections failed: {exc}"[:300])
                write_stage(node, stage)
            return nodes
        for (node, stage), key in zip(staged, keys, strict=True):
            sections = documents.get(key) if key is not None else None
            if sections:
                stage.document = _marked(sections, stage)
                write_stage(node, stage)
        return nodes


def _key(stage: StageData) -> tuple[str, str] | None:
    c = stage.candidate
    return (c.source, c.doc_hash) if c.doc_hash and c.position is not None else None


def _marked(sections: list[DocumentSection], stage: StageData) -> list[DocumentSection]:
    """Copies of ``sections`` with the node's own chunk and the other matched chunks marked, with their reasons."""
    reasons: dict[int, list[str]] = {}
    best = stage.candidate
    if best.position is not None:
        record = stage.rerank
        reasons[best.position] = [str(r) for r in record.hit_reasons] if record else []
    for other in stage.sections:
        if other.position is not None and other.position not in reasons:
            reasons[other.position] = [str(hit_reason(HitKind.L1_SEMANTIC, f"{other.similarity:.3f}"))]
    order = {position: rank for rank, position in enumerate(reasons)}  # the best first, then in rank order
    return [
        DocumentSection(
            breadcrumb=section.breadcrumb,
            content=section.content,
            position=section.position,
            matched=section.position in reasons,
            match_rank=order.get(section.position),
            hit_reasons=reasons.get(section.position, []),
        )
        for section in sections
    ]
