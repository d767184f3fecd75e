"""The ``memory`` lookup plan: the collection mirrored in this process, searched without a Milvus call.

On Milvus Lite (the embedded default: one process, FLAT search, its sub-requests run one after the other) a lookup's
one ``hybrid_search`` cost ~9 ms at 456 chunks and ~1.2 s at 100k. The same answers come from memory: the chunks'
vectors as one float32 matrix (a matrix-vector product is the FLAT search), their BM25 postings from the analysed
text the collection already holds (the field its BM25 function reads), and the row fields the pipeline turns into
candidates. Milvus stays the store of record: ingest writes only to Milvus, the mirror is read from it at start and
read again when the index version changes (the freshness check every ``freshness_check_s``), so another process's or
host's ingest is seen as the other state is.

What a search returns is what :func:`~kb_retrieval.retrieval.l1.full_text.milvus_hybrid_search` returns for the same
request on Milvus Lite: the ``top_k`` chunks by the dense metric, the ``lexical_top_k`` by BM25 (Milvus Lite's
formula and analyser: ``\\w+`` lower-cased, ``k1`` 1.5, ``b`` 0.75, query terms weighted by their count), the
exact-identifier chunks, each with its dense score computed as there, in float32. One difference, on purpose: the
BM25 statistics are the collection's (Lite keeps them per segment, so a collection written in several flushes scores
a term's rarity per segment); on a collection of one segment the scores are Lite's own.

Example:
    >>> mirror = MemoryMirror.load(client, settings)  # doctest: +SKIP
    >>> hits = mirror.hybrid_search(embedding, "redi memori", None, None, top_k=20, lexical_top_k=20)  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
from pymilvus import MilvusClient

from kb_retrieval.config import KBSettings
from kb_retrieval.indexing.milvus import iter_rows
from kb_retrieval.models import Candidate
from kb_retrieval.retrieval.bm25.postings import Bm25Postings
from kb_retrieval.retrieval.l1.base import L1Search, one_version_per_source, output_fields, rescored, to_candidate
from kb_retrieval.retrieval.l1.full_text import dense_scores
from kb_retrieval.retrieval.scope import FieldTest

#: Bytes a row costs beyond its vector and texts (its Python objects: strings, the metadata dict, postings).
_ROW_OVERHEAD = 1200


def _write_order(settings: KBSettings, row: dict[str, Any]) -> tuple[float, str, int, str]:
    meta = (row.get(settings.schema_fields.metadata_field) if settings.schema_fields.metadata_field else None) or {}
    stamp, position = meta.get("ingested_at"), meta.get("position")
    return (
        float(stamp) if isinstance(stamp, int | float) else 0.0,
        str(row.get(settings.schema_fields.source_field) or ""),
        position if isinstance(position, int) else 0,
        str(row[settings.schema_fields.id_field]),
    )


class MirrorTooLargeError(RuntimeError):
    """The collection does not fit the mirror's memory bound (``memory_plan_max_mb``)."""


class MemoryMirror:
    """The chunk collection in memory: vectors, BM25 postings and the fields candidates are made of.

    Read-only once loaded; a reload builds a new mirror (a lookup in flight keeps the one it started with).
    """

    name = "memory"

    def __init__(self, settings: KBSettings, rows: list[dict[str, Any]], vectors: np.ndarray, texts: list[str]) -> None:
        self.settings = settings
        self.ids = [str(r[settings.schema_fields.id_field]) for r in rows]
        self.rows = rows
        self._row_of = {chunk_id: i for i, chunk_id in enumerate(self.ids)}
        self.vectors = vectors
        # Row norms computed once, as full_text.dense_scores computes them on every call.
        self._norms = np.linalg.norm(vectors, axis=1) if len(vectors) else np.empty(0, dtype=np.float32)
        categories: dict[str, list[int]] = {}
        if settings.schema_fields.category_field:
            for i, row in enumerate(rows):
                categories.setdefault(str(row.get(settings.schema_fields.category_field) or ""), []).append(i)
        self._categories = {c: np.asarray(ix, dtype=np.int64) for c, ix in categories.items()}
        #: Scalar field -> value -> its rows, made on a scope's first test of the field (:meth:`scope_mask`).
        self._values: dict[str, dict[str, np.ndarray]] = {}
        self.bm25 = Bm25Postings(texts) if texts else None
        # Each row as a candidate, made on its first hit and rescored for every later one: a row never changes
        # within a mirror, so its fields are read and validated once (a reload builds a new mirror).
        self._candidates: list[Candidate | None] = [None] * len(rows)
        self.nbytes = int(vectors.nbytes + sum(len(t) for t in texts) + _ROW_OVERHEAD * len(rows)) + sum(
            len(str(r.get(settings.schema_fields.content_field, ""))) for r in rows
        )

    @classmethod
    def load(cls, client: MilvusClient, settings: KBSettings, *, lexical: bool, max_mb: float) -> MemoryMirror:
        """Read every row once; raises :class:`MirrorTooLargeError` as soon as the rows read pass ``max_mb``."""
        fields = [settings.schema_fields.id_field, *output_fields(settings), settings.schema_fields.vector_field]
        if lexical:
            fields.append(settings.schema_fields.lexical_text_field)
        rows: list[dict[str, Any]] = []
        vectors: list[Any] = []
        texts: list[str] = []
        limit = max_mb * 1024 * 1024
        used = 0
        for row in iter_rows(client, settings, fields):
            vectors.append(row.pop(settings.schema_fields.vector_field))
            if lexical:
                texts.append(str(row.pop(settings.schema_fields.lexical_text_field, "") or ""))
                used += len(texts[-1])
            used += (
                settings.schema_fields.dim * 4
                + _ROW_OVERHEAD
                + len(str(row.get(settings.schema_fields.content_field, "")))
            )
            if used > limit:
                raise MirrorTooLargeError(
                    f"the collection passes the memory plan's bound ({max_mb:g} MB, KB_MEMORY_PLAN_MAX_MB) "
                    f"after {len(rows)} rows"
                )
            rows.append(row)
        # Rows in the order ingest wrote them (Lite's order among equal scores): by write, document, position.
        order = sorted(range(len(rows)), key=lambda i: _write_order(settings, rows[i]))
        rows = [rows[i] for i in order]
        texts = [texts[i] for i in order] if texts else texts
        matrix = np.asarray([vectors[i] for i in order], dtype=np.float32).reshape(
            len(vectors), settings.schema_fields.dim
        )
        return cls(settings, rows, matrix, texts)

    def __len__(self) -> int:
        return len(self.ids)

    # --- a snapshot of it (kb_retrieval.indexing.snapshot) ----------------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        """What a snapshot keeps: the data, without the settings (bound again on load) or the candidates made."""
        state = self.__dict__.copy()
        state["settings"] = None
        state["_candidates"] = None
        state["_values"] = {}
        return state

    def bind(self, settings: KBSettings) -> None:
        """Attach a mirror loaded from a snapshot to the settings of the lookup object that loaded it."""
        self.settings = settings
        self._candidates = [None] * len(self.rows)
        self._values = {}

    # --- searches -----------------------------------------------------------------------------------------

    def evaluates(self, tests: tuple[FieldTest, ...]) -> bool:
        """True when every test is of a scalar field the mirror holds for each row (the id, source, category)."""
        fields = self.settings.schema_fields
        held = {fields.id_field, fields.source_field, fields.category_field} - {""}
        return all(t.field in held for t in tests)

    def scope_mask(self, tests: tuple[FieldTest, ...]) -> np.ndarray:
        """The rows a scope of AND-ed ``tests`` keeps, as a mask: what Milvus' expression selects (a row whose field
        holds no value passes no test, as in Milvus); the fields must be ones the mirror :meth:`evaluates`."""
        mask = np.ones(len(self.ids), dtype=bool)
        for test in tests:
            hits = np.zeros(len(self.ids), dtype=bool)
            hits[self._rows_with(test.field, test.values)] = True
            mask &= (~hits & self._valued(test.field)) if test.negated else hits
        return mask

    def rows_holding(self, field: str, values: Iterable[str]) -> list[dict[str, Any]]:
        """The rows (their fields, not to be changed) whose ``field`` holds one of ``values``, in the mirror's order:
        what a Milvus query ``field in [values]`` returns (a document's sections are read so on the memory plan)."""
        return [self.rows[i] for i in np.sort(self._rows_with(field, values)).tolist()]

    def _rows_with(self, field: str, values: Iterable[str]) -> np.ndarray:
        """The rows whose ``field`` holds one of ``values``."""
        if field == self.settings.schema_fields.id_field:
            return np.asarray([self._row_of[v] for v in values if v in self._row_of], dtype=np.int64)
        index = self._index(field)
        parts = [index[v] for v in values if v in index]
        return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)

    def _index(self, field: str) -> dict[str, np.ndarray]:
        """``field``'s values -> the rows holding each, made on the first test of the field (a benign race: two
        threads may both make it)."""
        if (index := self._values.get(field)) is None:
            rows: dict[str, list[int]] = {}
            for i, row in enumerate(self.rows):
                if (value := row.get(field)) is not None:
                    rows.setdefault(str(value), []).append(i)
            index = self._values[field] = {value: np.asarray(ix, dtype=np.int64) for value, ix in rows.items()}
        return index

    def _valued(self, field: str) -> np.ndarray:
        """The rows whose ``field`` holds a value (every row's id does)."""
        if field == self.settings.schema_fields.id_field:
            return np.ones(len(self.ids), dtype=bool)
        return self._mask(self._rows_with(field, self._index(field)))

    def _scope(self, category: str | None, ids: Iterable[str] | None) -> np.ndarray | None:
        """Row numbers under the filter, ascending (``None``: every row)."""
        rows: np.ndarray | None = None
        if category is not None and self.settings.schema_fields.category_field:
            rows = self._categories.get(category, np.empty(0, dtype=np.int64))
        if ids is not None:
            wanted = np.asarray(sorted({self._row_of[i] for i in ids if i in self._row_of}), dtype=np.int64)
            rows = wanted if rows is None else np.intersect1d(rows, wanted)
        return rows

    def _mask(self, rows: np.ndarray) -> np.ndarray:
        """``rows`` as a mask over every row."""
        mask = np.zeros(len(self.ids), dtype=bool)
        mask[rows] = True
        return mask

    def _dense(self, query: np.ndarray, rows: np.ndarray | None) -> np.ndarray:
        """The dense metric's score of each row in ``rows`` (every row when ``None``), as Milvus computes it."""
        vectors = self.vectors if rows is None else self.vectors[rows]
        metric = self.settings.schema_fields.metric.upper()
        if metric == "L2":
            return np.sum((vectors - query) ** 2, axis=1)
        dots = vectors @ query
        if metric == "IP":
            return dots
        norms = (self._norms if rows is None else self._norms[rows]) * np.linalg.norm(query)
        return np.divide(dots, norms, out=np.zeros_like(dots), where=norms > 0)

    def _top_dense(
        self, query: np.ndarray, rows: np.ndarray | None, k: int, within: np.ndarray | None = None
    ) -> np.ndarray:
        """The best ``k`` rows by the dense metric, best first (a FLAT search; the scores a candidate reports are
        :func:`~kb_retrieval.retrieval.l1.full_text.dense_scores`', as on the Milvus plan). ``within``: the caller's
        scope as a mask, applied to the scores as computed without it (no copy of the matrix for a scope that leaves
        out one chunk)."""
        scores = self._dense(query, rows)
        if within is not None:
            keep = within if rows is None else within[rows]
            rows = np.flatnonzero(keep) if rows is None else rows[keep]
            scores = scores[keep]
        better = scores if self.settings.schema_fields.metric.upper() == "L2" else -scores  # ascending = best first
        k = min(k, len(scores))
        if k <= 0:
            return np.empty(0, dtype=np.int64)
        top = np.argpartition(better, k - 1)[:k] if k < len(scores) else np.arange(len(scores))
        top = top[np.argsort(better[top], kind="stable")]
        return top if rows is None else rows[top]

    def search(
        self,
        embedding: list[float],
        top_k: int,
        category: str | None,
        ids: list[str] | None,
        scope: tuple[FieldTest, ...] | None = None,
    ) -> L1Search:
        """A dense search: the ``top_k`` best rows under the filter and the caller's ``scope`` (:meth:`scope_mask`;
        ``ids``: restricted to those chunks)."""
        query = np.asarray(embedding, dtype=np.float32)
        within = self.scope_mask(scope) if scope else None
        rows = self._top_dense(query, self._scope(category, ids), top_k, within)
        scores = dense_scores(query, self.vectors[rows], self.settings.schema_fields.metric)
        candidates = [self._candidate(int(r), float(s)) for r, s in zip(rows, scores, strict=True)]
        return L1Search(candidates=one_version_per_source(candidates), path="memory")

    def hybrid_search(
        self,
        embedding: list[float],
        terms: str,
        category: str | None,
        ids: list[str] | None,
        *,
        top_k: int,
        lexical_top_k: int,
        scope: tuple[FieldTest, ...] | None = None,
    ) -> L1Search:
        """Dense ``top_k``, BM25 ``lexical_top_k`` over ``terms`` and the ``ids`` chunks, all under the category
        filter and the caller's ``scope``: every hit with its dense score, BM25 hits first (best first), as the
        Milvus hybrid search.

        The sizes are the caller's (its settings'), not those of the settings the mirror was loaded with: one mirror
        serves every settings variant of a lookup (``with_settings(top_k=50)``)."""
        s = self.settings
        query = np.asarray(embedding, dtype=np.float32)
        rows_in = self._scope(category, None)
        within = self.scope_mask(scope) if scope else None
        allowed = None if rows_in is None else self._mask(rows_in)
        if within is not None:
            allowed = within if allowed is None else allowed & within
        order: dict[int, None] = {}
        bm25: dict[int, float] = {}
        if terms and lexical_top_k > 0 and self.bm25 is not None:
            rows, values = self.bm25.top(terms, lexical_top_k, allowed)
            bm25 = dict(zip(rows.tolist(), values.tolist(), strict=True))
            order = dict.fromkeys(bm25)
        dense_rows = self._top_dense(query, rows_in, top_k, within)
        order.update(dict.fromkeys(int(r) for r in dense_rows))
        if ids:
            restricted = self._scope(category, ids)
            if restricted is not None and within is not None:
                restricted = restricted[within[restricted]]
            order.update(dict.fromkeys(int(r) for r in (restricted if restricted is not None else ())))
        picked = np.fromiter(order, dtype=np.int64, count=len(order))
        scores = dense_scores(query, self.vectors[picked], s.schema_fields.metric)
        result = L1Search(path="memory")
        for row, score in zip(picked.tolist(), scores.tolist(), strict=True):
            result.candidates.append(self._candidate(row, score))
            if row in bm25:
                result.bm25[self.ids[row]] = bm25[row]
        return result

    def _candidate(self, row: int, score: float) -> Candidate:
        made = self._candidates[row]
        if made is None:
            fields = self.rows[row]
            made = self._candidates[row] = to_candidate(
                self.settings,
                chunk_id=self.ids[row],
                raw_score=score,
                fields=fields,
                content=fields.get(self.settings.schema_fields.content_field, ""),
                path="memory",
            )
        return rescored(made, score)  # a copy: the kept candidate is never handed out


def estimated_mirror_mb(chunks: int, settings: KBSettings, text_bytes: int = 2048) -> float:
    """About how many MB the mirror of ``chunks`` rows holds (vector, content and analysed text of ~1 KB each, the
    row's Python objects); the mirror itself counts what it reads."""
    return chunks * (settings.schema_fields.dim * 4 + _ROW_OVERHEAD + text_bytes) / (1024 * 1024)


def choose_plan(client: MilvusClient, settings: KBSettings, *, custom_path: bool) -> tuple[str, str]:
    """The lookup plan for this engine and these settings, and why, in one line (``stats`` and the trace say it).

    ``auto`` is ``memory`` on Milvus Lite (a local data dir or ``milvus-lite server``: FLAT search in one process,
    sub-requests one after the other), where a search from memory is 10-50x faster, and ``milvus`` on a server (an
    indexed search a few ms long, shared by every host). An explicit ``vector_store_mode`` (``vectorstore``,
    ``sdk``) or a path given by the caller is a request for that path: ``auto`` then searches Milvus through it.
    """
    from kb_retrieval.indexing.milvus import is_lite_engine

    if settings.retrieval.lookup_plan == "memory":
        return "memory", "lookup_plan 'memory'"
    if settings.retrieval.lookup_plan == "milvus":
        return "milvus", "lookup_plan 'milvus'"
    if custom_path:
        return "milvus", "a vector-store path was given: it serves the searches"
    if settings.retrieval.vector_store_mode != "auto":
        return "milvus", f"vector_store_mode '{settings.retrieval.vector_store_mode}' asks for that path"
    if not is_lite_engine(client, settings):
        return "milvus", "a Milvus server: one indexed search per attempt"
    return "memory", "Milvus Lite: the collection mirrored in memory, no Milvus call per lookup"
