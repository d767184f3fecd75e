"""Incremental, idempotent ingest of knowledge-base folders and LlamaIndex documents into one Milvus collection.

Size: over 400 lines: the ingest transaction (plan, write, record) in one module, so the order of its writes
(new chunks before old ones are deleted, the record last) reads in one place.

The collection itself is the record of what was ingested: every row carries its source, its KB folder and its
document's content hash, and chunk ids derive from (source, content hash, position). So a re-run over an unchanged
folder embeds and writes nothing, an edited document's new chunks are written before its old ones are deleted (a
reader sees the old or the new version, never a half), and a run killed at any point converges on the next run.
The L0 index is written the same way, one row per document in the companion collection ``<collection>_l0``
(:mod:`kb_retrieval.indexing.l0_index`), and so are the document vectors, in ``<collection>_docs``
(:mod:`kb_retrieval.indexing.doc_vectors`); every run that wrote anything publishes a new index version
(:mod:`kb_retrieval.indexing.index_version`) for long-lived readers.

LlamaIndex ``Document`` s and nodes come in the same way (:mod:`kb_retrieval.knowledge.documents`: identity from
``file_path``, else ``ref_doc_id`` / ``doc_id``); they are upserted, where a folder's run also removes the documents
no longer in it. Roots never overlap: a folder inside (or around) a folder already in the collection is refused,
because its files would come back a second time under other source ids; :func:`remove_root` takes a root out.

Example:
    >>> summary = ingest(["kb_retrieval/sample_kb"], KBSettings(state_dir=".kb-state"))  # doctest: +SKIP
    >>> summary.chunks_added  # doctest: +SKIP
    412
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.schema import BaseNode
from pydantic import BaseModel, Field

from kb_retrieval.config import KBSettings
from kb_retrieval.indexing.doc_vectors import (
    DocVectorPlan,
    embed_doc_texts,
    ensure_doc_vectors_collection,
    plan_chunk_means,
    plan_doc_vectors,
    write_planned_doc_vectors,
)
from kb_retrieval.indexing.embeddings import embed_passages, word_piece_limit
from kb_retrieval.indexing.index_version import ensure_meta_collection, publish_version
from kb_retrieval.indexing.ingest_record import forget_root, read_ingest_record, record_ingest
from kb_retrieval.indexing.l0_index import L0Index, ensure_l0_collection, l0_content_hash, write_l0
from kb_retrieval.indexing.lite_files import private_umask
from kb_retrieval.indexing.milvus import (
    METADATA_KEYS,
    VARCHAR_LIMITS,
    connect,
    ensure_collection,
    full_text_off,
    is_lite_engine,
    iter_rows,
)
from kb_retrieval.indexing.model_check import model_id
from kb_retrieval.indexing.onnx_query import passage_encoder
from kb_retrieval.indexing.static_embed import StaticEmbedder, load_static_embedder
from kb_retrieval.knowledge.chunker import Chunk, chunk_document
from kb_retrieval.knowledge.documents import knowledge_base_from_documents
from kb_retrieval.knowledge.loader import (
    KbDocument,
    KnowledgeBaseError,
    LoadedKnowledgeBase,
    SkippedFile,
    load_knowledge_base,
)
from kb_retrieval.knowledge.text import cut_to_bytes
from kb_retrieval.progress import progress_bar
from kb_retrieval.retrieval.bm25 import analysed_text, lexical_document

log = logging.getLogger(__name__)
#: Model batches embedded per window: texts are sorted by length inside a window, which is then written at once.
WINDOW_BATCHES = 16
T = TypeVar("T")


class SkippedEntry(BaseModel):
    """A file an ingest skipped, and why."""

    source: str
    reason: str


class IngestSummary(BaseModel):
    """What one ingest run did. ``--json`` prints exactly this.

    Chunks are counted by what happened to their document: ``chunks_added`` are the chunks of new documents,
    ``chunks_updated`` the new chunks of edited documents and ``chunks_replaced`` the old chunks those replaced
    (deleted once the new ones were written), ``chunks_removed`` the chunks of documents no longer in their folder,
    ``chunks_unchanged`` the chunks of unchanged documents. ``empty_kb_dirs`` lists the folders given that hold
    no document at all.
    """

    documents: int = 0
    documents_added: int = 0
    documents_updated: int = 0
    documents_removed: int = 0
    documents_unchanged: int = 0
    chunks_added: int = 0
    chunks_updated: int = 0
    chunks_replaced: int = 0
    chunks_removed: int = 0
    chunks_unchanged: int = 0
    chunks_embedded: int = 0
    skipped_files: int = 0
    skipped: list[SkippedEntry] = Field(default_factory=list)
    empty_kb_dirs: list[str] = Field(default_factory=list)
    seconds: float = 0.0
    embed_seconds: float = 0.0


@dataclass
class _DocPlan:
    doc: KbDocument
    chunks: list[Chunk]
    stale_ids: list[str]
    missing: list[Chunk]
    kind: str  # added | updated | unchanged


@dataclass
class _Existing:
    kb: str
    doc_hash: str = ""
    ids: set[str] = field(default_factory=set)


def ingest(
    kb_dirs: Sequence[str | Path | BaseNode],
    settings: KBSettings,
    *,
    embed_model: BaseEmbedding | None = None,
    progress: bool = False,
    root: str | Path | None = None,
    name: str | None = None,
) -> IngestSummary:
    """Bring the collection and the L0 index in line with the given KB folders and documents. Other roots are
    untouched.

    ``kb_dirs``: folders, LlamaIndex ``Document`` s or nodes (``SimpleDirectoryReader(...).load_data()``, an
    ``IngestionPipeline``'s output), or both. The documents form one root of their own (``root``: the folder their
    ``file_path`` s are relative to; ``name``: its identity when they are not files; see
    :func:`~kb_retrieval.knowledge.documents.knowledge_base_from_documents`).
    """
    started = time.perf_counter()
    if not kb_dirs:
        raise KnowledgeBaseError("no knowledge-base folder or document given")
    folders = [d for d in kb_dirs if isinstance(d, str | Path)]
    nodes = [d for d in kb_dirs if isinstance(d, BaseNode)]
    if other := [d for d in kb_dirs if not isinstance(d, str | Path | BaseNode)]:
        raise TypeError(
            f"ingest() takes folders (str or Path) and LlamaIndex Documents or nodes, got {type(other[0]).__name__}"
        )
    kbs = [
        load_knowledge_base(
            d, category_from=settings.chunking.category_from, max_file_bytes=settings.chunking.max_file_bytes
        )
        for d in folders
    ]
    if nodes:
        kbs.append(
            knowledge_base_from_documents(
                nodes,
                root=root,
                name=name,
                category_from=settings.chunking.category_from,
                max_file_bytes=settings.chunking.max_file_bytes,
            )
        )
    empty = [str(given) for given, kb in zip(folders, kbs, strict=False) if not kb.documents]
    with private_umask():  # the state dir's files the owner's only, for library callers as for the CLI
        return _apply(kbs, settings, embed_model=embed_model, progress=progress, empty=empty, started=started)


def remove_root(root: str | Path, settings: KBSettings) -> IngestSummary:
    """Take a knowledge-base root out of the collection: its chunks, L0 entries and document vectors (a folder as
    given to ingest, or ``documents:<name>`` for documents handed in by a program). Raises
    ``KnowledgeBaseError`` naming the roots there are when ``root`` is not one of them."""
    started = time.perf_counter()
    client = connect(settings)
    ensure_collection(client, settings, create=False)
    roots = {entry.kb for entry in _existing_rows(client, settings).values()}
    given = str(root)
    kb_id = given if given in roots else Path(given).resolve().as_posix()
    if kb_id not in roots:
        raise KnowledgeBaseError(
            f"{given} is not a knowledge-base root of collection '{settings.storage.collection}'; its roots: "
            f"{', '.join(sorted(roots)) or 'none'}"
        )
    kb = LoadedKnowledgeBase(Path(kb_id), [], [], name="" if kb_id.startswith("/") else kb_id)
    summary = _apply([kb], settings, embed_model=None, progress=False, empty=[], started=started)
    forget_root(client, settings, kb_id)
    return summary


def _apply(
    kbs: list[LoadedKnowledgeBase],
    settings: KBSettings,
    *,
    embed_model: BaseEmbedding | None,
    progress: bool,
    empty: list[str],
    started: float,
) -> IngestSummary:
    """Write ``kbs`` (each root's documents; a complete root's others removed) and publish the index version."""
    encoder = _EncoderLoad(settings, embed_model, wanted=any(kb.documents for kb in kbs))
    try:
        return _write_all(kbs, settings, encoder, progress=progress, empty=empty, started=started)
    finally:
        encoder.close()


def _write_all(
    kbs: list[LoadedKnowledgeBase],
    settings: KBSettings,
    encoder: _EncoderLoad,
    *,
    progress: bool,
    empty: list[str],
    started: float,
) -> IngestSummary:
    client = connect(settings)
    ensure_collection(client, settings)
    # The companions exist before any chunk is written: a collection with chunks always has its L0 index.
    ensure_l0_collection(client, settings)
    ensure_doc_vectors_collection(client, settings)
    ensure_meta_collection(client, settings)
    existing = _existing_rows(client, settings)
    _refuse_nested_roots(kbs, {entry.kb for entry in existing.values()}, settings)
    _name_shared_sources(kbs, existing, settings)

    skipped = [s for kb in kbs for s in kb.skipped]  # each already warned about by the loader
    for kb in kbs:
        kb.documents, too_long = _fit_limits(kb.documents)
        for entry in too_long:
            log.warning("skipped %s: %s", entry.source_id, entry.reason)
        skipped.extend(too_long)
    plans, removed = _plan(kbs, existing, settings)

    summary = IngestSummary(
        skipped_files=len(skipped),
        skipped=[SkippedEntry(source=s.source_id, reason=s.reason) for s in skipped],
        empty_kb_dirs=empty,
    )
    to_write = [c for plan in plans for c in plan.missing]
    model = encoder.get() if to_write else encoder.given
    # A collection with full-text search gets each chunk's analysed text (Milvus computes BM25 from it).
    full_text = full_text_off(client, settings) is None
    writer = _Writer(
        client,
        settings,
        model,
        total=len(to_write),
        progress=progress,
        full_text=full_text,
        documents=sum(1 for plan in plans if plan.missing),
    )
    chunk_ids = {plan.doc.source_id: [c.chunk_id for c in plan.chunks] for plan in plans}
    doc_plan = plan_doc_vectors(client, settings, kbs, chunk_ids)
    try:
        for plan in plans:
            writer.add(plan)
        writer.flush()
        wrote = bool(writer.embedded or removed or any(plan.stale_ids for plan in plans))
        # What follows the chunks' writes runs on the write thread after them while this thread embeds the document
        # texts: the removed documents' chunks deleted, the flush, then the L0 index (a reader never finds an entry
        # whose chunks are not written yet).
        after_chunks = writer.then(
            lambda: _after_chunks(client, settings, kbs, chunk_ids, removed, doc_plan, flush=wrote)
        )
        doc_seconds = 0.0
        embedded_docs: list[list[Any]] = []
        if doc_plan.todo:
            doc_model = model or encoder.get()
            t0 = time.perf_counter()
            embedded_docs = embed_doc_texts(doc_plan, doc_model, settings.embedding.embed_batch_size)
            doc_seconds = time.perf_counter() - t0
    except BaseException:
        # An interrupted run leaves whole writes behind it: the ones in flight end first; this error is the one.
        with contextlib.suppress(Exception):
            writer.finish()
        raise
    writer.finish()  # a failed write raised here, before anything of the document vectors is written
    l0_rows, chunk_means = after_chunks.result()
    wrote = l0_rows > 0 or wrote
    # The document vectors after the chunks (their text vectors are the means of the chunks written), then a new
    # index version after every write, then the local copy of the L0 index.
    static_model = encoder.static() if doc_plan.todo else None
    doc_rows = write_planned_doc_vectors(
        client,
        settings,
        doc_plan,
        embedded_docs,
        chunk_means=chunk_means,
        static_model=static_model,
        progress=progress,
    )
    wrote = doc_rows > 0 or wrote
    _record(client, settings, kbs, model, embedded=bool(writer.embedded or doc_rows))
    publish_version(client, settings, content=l0_content_hash(client, settings), wrote=wrote)
    L0Index.load_from_milvus(client, settings).save(settings.l0_index_path())

    for plan in plans:
        setattr(summary, f"documents_{plan.kind}", getattr(summary, f"documents_{plan.kind}") + 1)
        setattr(summary, f"chunks_{plan.kind}", getattr(summary, f"chunks_{plan.kind}") + len(plan.chunks))
        summary.chunks_replaced += len(plan.stale_ids)
    summary.documents = len(plans)
    summary.documents_removed = len(removed)
    summary.chunks_removed = sum(len(ids) for ids in removed.values())
    summary.chunks_embedded = writer.embedded
    summary.embed_seconds = round(writer.embed_seconds + doc_seconds, 3)
    summary.seconds = round(time.perf_counter() - started, 3)
    return summary


def _after_chunks(
    client: Any,
    settings: KBSettings,
    kbs: list[LoadedKnowledgeBase],
    chunk_ids: dict[str, list[str]],
    removed: dict[str, list[str]],
    doc_plan: DocVectorPlan,
    *,
    flush: bool,
) -> tuple[int, list[dict[str, np.ndarray]]]:
    """Once every new chunk is written: the removed documents' chunks deleted, the collection flushed when anything
    was written, the L0 index brought in line, and the chunk means of the document vectors to write read back;
    returns the L0 rows written or deleted, and those means (:func:`plan_chunk_means`)."""
    for ids in removed.values():
        _delete(client, settings, ids)
    if flush and is_lite_engine(client, settings):
        # Milvus Lite searches rows still in its in-memory table ~2.5x slower than flushed segments (measured on the
        # sample KB: ~35 ms against ~14 ms a lookup), and a server flushes and indexes on its own.
        client.flush(settings.storage.collection)
    return write_l0(client, settings, kbs, chunk_ids), plan_chunk_means(client, settings, doc_plan)


def _record(
    client: Any, settings: KBSettings, kbs: list[LoadedKnowledgeBase], model: BaseEmbedding | None, *, embedded: bool
) -> None:
    """The ingest record (:mod:`~kb_retrieval.indexing.ingest_record`): the roots and metadata keys, and the model
    id when this run embedded anything or none is recorded yet (a run that embedded nothing cannot vouch for it)."""
    model_name = model_id(model) if model is not None else ""
    if model_name and not embedded and read_ingest_record(client, settings).embed_model:
        model_name = ""
    keys = {*METADATA_KEYS, *(key for kb in kbs for doc in kb.documents for key in doc.metadata)}
    # The roots map a stock node's file_path to a source id: folders only (a named document set has no folder).
    roots = [kb.kb_id for kb in kbs if not kb.name and kb.documents]
    record_ingest(client, settings, embed_model=model_name, roots=roots, metadata_keys=keys)


def _name_shared_sources(kbs: list[LoadedKnowledgeBase], existing: dict[str, _Existing], settings: KBSettings) -> None:
    """Give a source id to every document when two roots hold the same relative path.

    Different documents at one relative path (each corpus's ``SOURCE.txt``, each docs tree's ``index.md``) are both
    kept: the root that holds the path first (in the collection, else first given) keeps the plain path, a later
    root's document is qualified by its root's folder name (``awesome-alerts/SOURCE.txt``), and keeps that id on
    every later ingest. So a root ingested alone never changes ids, and adding a root never renames another's.
    The same document under two roots (same path, same content) is refused: it would answer twice.
    """
    owner = {source: (entry.kb, entry.doc_hash) for source, entry in existing.items()}
    for kb in kbs:
        label = kb.name.split(":", 1)[-1] if kb.name else Path(kb.kb_id).name
        own = {doc.source_id for doc in kb.documents}
        qualified: list[str] = []
        for doc in kb.documents:
            plain, named = doc.source_id, f"{label}/{doc.source_id}"
            holder, holder_hash = owner.get(plain, (kb.kb_id, ""))
            named_holder = owner.get(named, ("", ""))[0]
            kept_before = named not in own and named_holder == kb.kb_id
            if holder != kb.kb_id and holder_hash == doc.content_hash:
                where = f"already in collection '{settings.storage.collection}'" if plain in existing else "given too"
                raise KnowledgeBaseError(
                    f"source id '{plain}' from {kb.kb_id} is the same document as {holder}'s ({where}): it would "
                    "answer twice; ingest it under one root only"
                )
            if holder != kb.kb_id or kept_before:
                if named in own or named_holder not in ("", kb.kb_id):
                    raise KnowledgeBaseError(
                        f"source id '{plain}' is under two roots ({holder} and {kb.kb_id}) and '{named}' is taken "
                        f"by {kb.kb_id if named in own else named_holder}: rename one of the files or folders"
                    )
                doc.source_id = named
                qualified.append(named)
            owner[doc.source_id] = (kb.kb_id, doc.content_hash)
        if qualified:
            log.warning(
                "%d document(s) of %s share their relative path with another root's: source ids prefixed '%s/' (%s)",
                len(qualified),
                kb.kb_id,
                label,
                ", ".join(qualified[:3]) + (", ..." if len(qualified) > 3 else ""),
            )


def _refuse_nested_roots(kbs: list[LoadedKnowledgeBase], existing: set[str], settings: KBSettings) -> None:
    """A folder inside (or holding) another root, in the collection or given with it, is refused: its files would
    be ingested a second time under other source ids (``nginx/502.md`` beside ``502.md``), and both would answer.
    The same folder again is the same root (an update)."""
    given = [kb.kb_id for kb in kbs if not kb.name and kb.documents]
    for kb_id in given:
        for other in sorted(existing | set(given)):
            if other == kb_id or not other.startswith("/"):
                continue
            inner, outer = (kb_id, other) if Path(kb_id).is_relative_to(other) else (other, kb_id)
            if not Path(inner).is_relative_to(outer):
                continue
            where = f"already in collection '{settings.storage.collection}'" if other in existing else "given too"
            raise KnowledgeBaseError(
                f"knowledge-base folder {inner} is inside {outer} ({where}): its documents would be ingested twice "
                f"under two roots; ingest {outer} alone (its subfolders come with it), or take the root out first "
                f"with `kb-retrieval ingest --remove-root {other}`"
            )


def _fit_limits(documents: list[KbDocument]) -> tuple[list[KbDocument], list[SkippedFile]]:
    kept: list[KbDocument] = []
    skipped: list[SkippedFile] = []
    for doc in documents:
        if len(doc.source_id.encode()) > VARCHAR_LIMITS["source"]:
            skipped.append(SkippedFile(doc.source_id[:80] + "...", "source id longer than 1024 bytes"))
        elif doc.category and len(doc.category.encode()) > VARCHAR_LIMITS["category"]:
            skipped.append(SkippedFile(doc.source_id, "category longer than 256 bytes"))
        else:
            kept.append(doc)
    return kept, skipped


def _existing_rows(client: Any, settings: KBSettings) -> dict[str, _Existing]:
    existing: dict[str, _Existing] = {}
    fields = [
        settings.schema_fields.id_field,
        settings.schema_fields.source_field,
        settings.schema_fields.metadata_field,
    ]
    for row in iter_rows(client, settings, fields):
        meta = row.get(settings.schema_fields.metadata_field) or {}
        entry = existing.setdefault(
            row[settings.schema_fields.source_field],
            _Existing(kb=str(meta.get("kb", "")), doc_hash=str(meta.get("doc_hash", ""))),
        )
        entry.ids.add(row[settings.schema_fields.id_field])
    return existing


def _plan(
    kbs: list[LoadedKnowledgeBase], existing: dict[str, _Existing], settings: KBSettings
) -> tuple[list[_DocPlan], dict[str, list[str]]]:
    plans: list[_DocPlan] = []
    removed: dict[str, list[str]] = {}
    limit = word_piece_limit(settings.embedding.embed_model)
    for kb in kbs:
        current = {doc.source_id for doc in kb.documents}
        for doc in kb.documents:
            before = existing.get(doc.source_id)
            if before is not None and before.kb != kb.kb_id:
                raise KnowledgeBaseError(
                    f"source id '{doc.source_id}' from {kb.root} is already in collection "
                    f"'{settings.storage.collection}' from another folder ({before.kb or 'unknown'})"
                )
            chunks = chunk_document(doc, settings.chunking.chunk_tokens, settings.chunking.chunk_overlap, limit)
            new_ids = {c.chunk_id for c in chunks}
            old_ids = before.ids if before else set()
            kind = "added" if before is None else "unchanged" if old_ids == new_ids else "updated"
            plans.append(
                _DocPlan(
                    doc=doc,
                    chunks=chunks,
                    stale_ids=sorted(old_ids - new_ids),
                    missing=[c for c in chunks if c.chunk_id not in old_ids],
                    kind=kind,
                )
            )
        for source, entry in sorted(existing.items()):
            if kb.complete and entry.kb == kb.kb_id and source not in current:
                removed[source] = sorted(entry.ids)
    return plans, removed


class _EncoderLoad:
    """The passage encoder (``given``, else :func:`passage_encoder`'s), loading on a thread of its own from the start
    of a run that may embed: onnxruntime builds its session mostly without the GIL (measured: a Python thread kept
    ~75% of its pace meanwhile), so the load overlaps opening Milvus, creating the collections and planning instead
    of following them. The static model of the document vectors loads after it, on the same thread, while the
    chunks embed. A run that then embeds nothing has loaded them for nothing, on the side."""

    def __init__(self, settings: KBSettings, given: BaseEmbedding | None, *, wanted: bool) -> None:
        self.settings = settings
        self.given = given
        self._pool: ThreadPoolExecutor | None = None
        self._loading: Future[BaseEmbedding] | None = None
        self._static: Future[StaticEmbedder] | None = None
        if wanted:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kb-ingest-model")
            if given is None:
                self._loading = self._pool.submit(passage_encoder, settings)
            self._static = self._pool.submit(load_static_embedder, settings.resolved_model_cache_dir())

    def static(self) -> StaticEmbedder:
        """The static model of the document vectors, loaded on the same thread after the encoder (waited for); here,
        in a run that was not to embed."""
        if self._static is None:
            return load_static_embedder(self.settings.resolved_model_cache_dir())
        return self._static.result()

    def get(self) -> BaseEmbedding:
        """The encoder, waiting for its load (an error in it raised here, as a load in this thread would)."""
        if self.given is not None:
            return self.given
        if self._loading is None:
            self._loading = Future()
            self._loading.set_result(passage_encoder(self.settings))
        return self._loading.result()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False)


class _Writer:
    """Embeds pending chunks in windows across documents (sorted by length inside a window); deletes a document's
    stale chunks once its new ones are in. A window's rows are written on a thread of their own while the next
    window embeds, one write at a time and in order; :meth:`then` queues more work behind the writes."""

    def __init__(
        self,
        client: Any,
        settings: KBSettings,
        model: BaseEmbedding | None,
        *,
        total: int,
        progress: bool,
        full_text: bool = False,
        documents: int = 0,
    ) -> None:
        self.client = client
        self.full_text = full_text
        self.settings = settings
        self.model = model
        self.batch = settings.embedding.embed_batch_size * WINDOW_BATCHES
        self.pending: list[tuple[_DocPlan, Chunk]] = []
        self.waiting: list[_DocPlan] = []
        self.embedded = 0
        self.embed_seconds = 0.0
        self.documents_total = documents
        self.documents_done = 0
        # Chunks embedded, with tqdm's rate and ETA, and documents done beside them; only on a terminal.
        self.bar = progress_bar(total, "embedding", "chunk", enabled=progress)
        self.writes = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kb-ingest-write")
        self.written: Future[Any] | None = None

    def add(self, plan: _DocPlan) -> None:
        self.pending.extend((plan, c) for c in plan.missing)
        self.waiting.append(plan)
        if len(self.pending) >= self.batch:
            self._flush()

    def flush(self) -> None:
        """Embed what is pending (the last window) and put its write in flight."""
        self._flush()
        self.bar.close()

    def then(self, job: Callable[[], T]) -> Future[T]:
        """Run ``job`` on the write thread once the writes in flight are done, and only if they succeeded (else
        their error is its error too): what follows the chunks never runs after a failed chunk write."""
        previous = self.written

        def after_writes() -> T:
            if previous is not None:
                previous.result()
            return job()

        future = self.writes.submit(after_writes)
        self.written = future
        return future

    def finish(self) -> None:
        """Wait for the work in flight (its error raised here) and stop the write thread."""
        try:
            self._wait()
        finally:
            self.writes.shutdown()
            self.bar.close()

    def _flush(self) -> None:
        embedded: list[tuple[tuple[_DocPlan, Chunk], np.ndarray]] = []
        written_at = 0.0
        if self.pending:
            assert self.model is not None
            t0 = time.perf_counter()
            texts = [c.embedding_text() for _, c in self.pending]
            try:  # the bar moves as each model batch is done
                vectors = embed_passages(self.model, texts, self.settings.embedding.embed_batch_size, self.bar.update)
            except BaseException:
                # An interrupted run leaves whole windows behind it: the write in flight ends first.
                with contextlib.suppress(Exception):
                    self._wait()
                raise
            self.embed_seconds += time.perf_counter() - t0
            written_at = round(time.time(), 6)  # one stamp per write: lookups prefer a document's newest version
            embedded = list(zip(self.pending, vectors, strict=True))
            self.embedded += len(embedded)
            self.pending = []
        stale = [plan.stale_ids for plan in self.waiting if plan.stale_ids]
        if embedded or stale:
            self._wait()  # one write in flight: the previous window's is done (or its error raised) first
            self.written = self.writes.submit(self._write, embedded, written_at, stale)
        self.documents_done += sum(1 for plan in self.waiting if plan.missing)
        if self.documents_total:
            self.bar.set_postfix_str(f"{self.documents_done}/{self.documents_total} documents", refresh=True)
        self.waiting.clear()

    def _write(
        self, embedded: list[tuple[tuple[_DocPlan, Chunk], np.ndarray]], written_at: float, stale: list[list[str]]
    ) -> None:
        # The rows are built here, on the write thread, while the next window (or the document texts) embeds.
        rows = [
            _row(self.settings, plan.doc, chunk, len(plan.chunks), vec, written_at, full_text=self.full_text)
            for (plan, chunk), vec in embedded
        ]
        if rows:
            self.client.upsert(self.settings.storage.collection, rows)
        # Every waiting document now has all its new chunks written: drop its old ones.
        for ids in stale:
            _delete(self.client, self.settings, ids)

    def _wait(self) -> None:
        if self.written is not None:
            self.written.result()
            self.written = None


def _row(
    settings: KBSettings,
    doc: KbDocument,
    chunk: Chunk,
    chunk_count: int,
    vector: np.ndarray,
    written_at: float,
    *,
    full_text: bool = False,
) -> dict[str, Any]:
    content = _fit_varchar(chunk.content)
    internal = {
        "title": doc.title,
        "breadcrumb": chunk.breadcrumb_text,
        "keywords": doc.keywords,
        "entities": doc.entities,
        "kb": doc.kb_id,
        "doc_hash": doc.content_hash,
        "position": chunk.position,
        "chunk_count": chunk_count,
        "ingested_at": written_at,
    }
    row = {
        settings.schema_fields.id_field: chunk.chunk_id,
        settings.schema_fields.content_field: content,
        # As Python floats in one go (``tolist``: the same values as ``float()`` of each element, a tenth the time).
        settings.schema_fields.vector_field: vector.tolist(),
        # Other frontmatter keys are kept, but never in place of the pipeline's own (a frontmatter `doc_hash`).
        settings.schema_fields.metadata_field: {
            **{k: v for k, v in doc.metadata.items() if k not in internal},
            **internal,
        },
        settings.schema_fields.category_field: doc.category or "",
        settings.schema_fields.source_field: doc.source_id,
    }
    if full_text:
        # What BM25 indexes: the header and the content, identifiers split into their words, analysed as a lookup
        # analyses its query (the same text the in-process BM25 indexes).
        text = lexical_document(doc.title, chunk.breadcrumb_text, content)
        row[settings.schema_fields.lexical_text_field] = _fit_varchar(analysed_text(text))
    return row


def _fit_varchar(text: str) -> str:
    """``text`` cut (at a character boundary) to fit a VARCHAR field of the content limit."""
    return cut_to_bytes(text, VARCHAR_LIMITS["content"] - 16)


def _delete(client: Any, settings: KBSettings, ids: list[str]) -> None:
    for start in range(0, len(ids), 1000):
        client.delete(settings.storage.collection, ids=ids[start : start + 1000])
