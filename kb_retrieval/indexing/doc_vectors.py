"""Document vectors: four per document, stored in Milvus beside the chunks, for ranking documents as wholes.

Size: under 500 lines, one concern (the per-document vectors: their texts, their collection, written at
ingest and read at lookup), so the collection's layout is defined in one place; the text builders are the part to move
out if it grows.

A chunk vector says how well one section matches; a question in an engineer's own words ("two of our three
Alertmanager replicas stopped overnight") often matches a runbook as a whole better than any one of its sections,
and sibling runbooks differ mostly in their titles. So every document also gets

- a **title** vector: the title, CamelCase split (``KubeQuotaAlmostFull`` -> "Kube Quota Almost Full");
- a **summary** vector: the title, then the first 60 words of the document's opening section (a runbook's Meaning);
- a **text** vector: the mean of its chunk vectors (the whole document, section by section, at no embedding cost;
  it ranked as well as embedding the whole text, which the model reads only to its first 256 word pieces);
- a **static summary** vector: the summary text again, by a second, static model
  (:mod:`kb_retrieval.indexing.static_embed`, 256 dims), a second opinion where the first model's similarities of
  sibling runbooks are a few hundredths apart;
- its **title** and its **terms** (the distinct words of its title and text) as text: a lookup counts in how many
  documents each word occurs (:class:`~kb_retrieval.indexing.static_embed.TermWeights`) and compares the query with
  each title by the static model, words weighted by their rarity, so that a word every document shares ("Prometheus"
  in the Prometheus docs, "Kube" in the Kubernetes runbooks) says little about which one a question is about.

Ingest writes one row per document into the companion collection ``<collection>_docs`` the way it writes the L0
index (:mod:`kb_retrieval.indexing.l0_index`): keyed by source, only what changed, only rows of the folders it
ingests deleted. A lookup holds them in memory (a few KB per document) and the
:class:`~kb_retrieval.retrieval.doc_rank.DocumentRanker` turns them into document similarities for the candidates.

Example:
    >>> vectors = DocumentVectors.load_from_milvus(connect(settings), settings)  # doctest: +SKIP
    >>> vectors.similarities([0.1] * 384, ["runbooks/KubePodCrashLooping.md"])  # doctest: +SKIP
    {'runbooks/KubePodCrashLooping.md': (0.61, 0.58, 0.55, 0.0, 0.0)}
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
from llama_index.core.base.embeddings.base import BaseEmbedding
from pymilvus import DataType, MilvusClient

from kb_retrieval.config import KBSettings
from kb_retrieval.indexing.embeddings import embed_passages, normalise
from kb_retrieval.indexing.milvus import (
    VARCHAR_LIMITS,
    companion_problem,
    ensure_side_collection,
    iter_rows,
    rows_where,
)
from kb_retrieval.indexing.static_embed import (
    STATIC_DIM,
    STATIC_MODEL,
    StaticEmbedder,
    TermWeights,
    load_static_embedder,
    unit_rows,
)
from kb_retrieval.knowledge.loader import KbDocument, LoadedKnowledgeBase
from kb_retrieval.knowledge.text import cut_to_bytes, heading, is_fence, words
from kb_retrieval.progress import progress_bar
from kb_retrieval.retrieval.filters import in_expr

#: Suffix of the companion collection holding the document vectors of ``<collection>``.
DOC_VECTORS_SUFFIX = "_docs"
#: How a document becomes its vectors; a change re-embeds every document on the next ingest.
DOC_VECTORS_VERSION = 4
#: The embedding model's three vectors of a document, in this order everywhere (the stored vector, arrays,
#: similarities); the static summary vector follows them.
KINDS = ("title", "summary", "text")
#: One FLOAT_VECTOR field of 3 x dim + 256 holds them end to end: a Milvus 2.3 server allows one vector field per
#: collection (:func:`~kb_retrieval.indexing.milvus.ensure_side_collection`); it is read, never searched.
VECTORS_FIELD = "doc_vectors"
#: The readable title and the distinct words of the document (space-separated, in order of first use).
TITLE_FIELD = "title"
TERMS_FIELD = "terms"
#: A document's terms past this many UTF-8 bytes are left out (Milvus' VARCHAR limit; a 17 KB page has ~2,000).
TERMS_MAX_BYTES = 65535
TITLE_MAX_BYTES = 1024
SUMMARY_WORDS = 60
WRITE_BATCH = 200
#: Documents whose chunk vectors one query reads (their chunks must fit Milvus' query window).
CHUNK_QUERY_DOCUMENTS = 50
_KB_MAX_BYTES = 4096
_CAMEL_WORD = re.compile(r"\b[A-Za-z]*[a-z][A-Z][A-Za-z0-9]*\b")
_CAMEL_PART = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|\d+")


def readable_title(title: str) -> str:
    """CamelCase words split into capitalised words: ``KubeQuotaAlmostFull`` -> ``Kube Quota Almost Full``."""
    return _CAMEL_WORD.sub(
        lambda m: " ".join(p.capitalize() if p.islower() else p for p in _CAMEL_PART.findall(m.group(0))), title
    )


def opening_words(body: str, limit: int = SUMMARY_WORDS) -> str:
    """The first ``limit`` words of the first section that has prose (headings and code blocks skipped)."""
    found: list[str] = []
    fenced = False
    for line in body.splitlines():
        if is_fence(line):
            fenced = not fenced
            continue
        if fenced:
            continue
        if heading(line):
            if found:
                break
            continue
        found.extend(line.split())
        if len(found) >= limit:
            break
    return " ".join(found[:limit])


def document_texts(doc: KbDocument) -> tuple[str, str]:
    """The title and summary a document's first two vectors are embedded from (see the module doc)."""
    title = readable_title(doc.title)
    return title, f"{title}: {opening_words(doc.body)}"


def document_terms(doc: KbDocument) -> str:
    """The distinct words of the document's title and text in order of first use, as far as ``TERMS_MAX_BYTES``."""
    return _fit(" ".join(dict.fromkeys(words(f"{readable_title(doc.title)} {doc.body}"))), TERMS_MAX_BYTES)


def _fit(text: str, limit: int) -> str:
    """``text`` cut at its last space within ``limit`` UTF-8 bytes (whole words only)."""
    cut = cut_to_bytes(text, limit)
    return cut if cut == text else cut.rsplit(" ", 1)[0]


def doc_vectors_collection_name(settings: KBSettings) -> str:
    """The name of the document-vector collection beside the chunks' collection."""
    return settings.storage.collection + DOC_VECTORS_SUFFIX


def stored_dim(settings: KBSettings) -> int:
    """The length of a row's vector field: the model's three vectors, then the static summary vector."""
    return len(KINDS) * settings.schema_fields.dim + STATIC_DIM


def _older_layout(client: MilvusClient, name: str, settings: KBSettings) -> str | None:
    """How a companion with our vector field differs from this version's layout (another vector length, or no
    title and terms), or None."""
    fields = {f["name"]: f for f in client.describe_collection(name)["fields"]}
    dim = int((fields[VECTORS_FIELD].get("params") or {}).get("dim", 0)) if VECTORS_FIELD in fields else None
    if dim is not None and dim != stored_dim(settings):
        return f"collection '{name}' holds vectors of {dim} values, not {stored_dim(settings)}: an older layout"
    if missing := sorted({TITLE_FIELD, TERMS_FIELD} - set(fields)):
        return f"collection '{name}' lacks fields {', '.join(missing)}: an older layout"
    return None


def _row_hash(doc: KbDocument, settings: KBSettings, chunk_ids: Sequence[str]) -> str:
    """Everything a row is computed from: the document, the model, how (the version) and its chunks (the text vector
    is their mean, so a change of chunking rewrites it)."""
    digest = json.dumps(
        [DOC_VECTORS_VERSION, settings.embedding.embed_model, STATIC_MODEL, doc.content_hash, sorted(chunk_ids)],
        ensure_ascii=False,
    )
    return hashlib.sha256(digest.encode()).hexdigest()


def _doc_vector_fields(schema: Any) -> None:
    schema.add_field("source", DataType.VARCHAR, is_primary=True, max_length=VARCHAR_LIMITS["source"])
    schema.add_field("kb", DataType.VARCHAR, max_length=_KB_MAX_BYTES)
    schema.add_field("row_hash", DataType.VARCHAR, max_length=64)
    schema.add_field(TITLE_FIELD, DataType.VARCHAR, max_length=TITLE_MAX_BYTES)
    schema.add_field(TERMS_FIELD, DataType.VARCHAR, max_length=TERMS_MAX_BYTES)


def ensure_doc_vectors_collection(client: MilvusClient, settings: KBSettings) -> str:
    """Create the companion collection when missing, and load it; returns its name. A companion of another layout
    (written by an older kb-retrieval: another vector length, or no title and terms) is dropped first: it is derived
    data, and every row of it would be rewritten anyway (its row hashes name the older version)."""
    name = doc_vectors_collection_name(settings)
    ours = client.has_collection(name) and companion_problem(client, name, {VECTORS_FIELD}) is None
    if ours and _older_layout(client, name, settings):
        client.drop_collection(name)
    ensure_side_collection(
        client, settings, name, _doc_vector_fields, vector_field=VECTORS_FIELD, vector_dim=stored_dim(settings)
    )
    return name


def doc_vectors_off_reason(client: MilvusClient, settings: KBSettings) -> str | None:
    """Why the collection has no usable document vectors (no or a foreign companion), or None."""
    name = doc_vectors_collection_name(settings)
    problem = companion_problem(client, name, {"source", VECTORS_FIELD}) or _older_layout(client, name, settings)
    if problem is None:
        return None
    return (
        f"collection '{settings.storage.collection}' has no document vectors ({problem}): documents are ranked "
        f"by their chunks until `kb-retrieval ingest` writes them"
    )


class PlannedDoc(NamedTuple):
    """A document whose companion row is (re)written: its KB id, its row hash, and its title and summary texts
    (:func:`document_texts`, worked out once for their embedding and for the row)."""

    doc: KbDocument
    kb_id: str
    row_hash: str
    texts: tuple[str, str]


@dataclass
class DocVectorPlan:
    """What an ingest changes in the companion: ``todo``, the documents whose row is missing or stale, in write
    batches of ``WRITE_BATCH``; ``deletes``, the sources whose row goes (their documents are no longer in their
    folder)."""

    todo: list[PlannedDoc]
    deletes: list[str]

    def batches(self) -> list[list[PlannedDoc]]:
        return [self.todo[start : start + WRITE_BATCH] for start in range(0, len(self.todo), WRITE_BATCH)]


def plan_doc_vectors(
    client: MilvusClient,
    settings: KBSettings,
    kbs: Sequence[LoadedKnowledgeBase],
    chunk_ids: Mapping[str, Sequence[str]],
) -> DocVectorPlan:
    """The companion rows to write and delete so that each KB folder's rows are exactly its documents (``chunk_ids``
    by source): a row whose hash (:func:`_row_hash`) is the stored one is left alone."""
    name = ensure_doc_vectors_collection(client, settings)
    existing = {
        row["source"]: row for row in iter_rows(client, settings, ["source", "kb", "row_hash"], collection=name)
    }
    plan = DocVectorPlan(todo=[], deletes=[])
    for kb in kbs:
        current = {doc.source_id for doc in kb.documents}
        for doc in kb.documents:
            row_hash = _row_hash(doc, settings, chunk_ids.get(doc.source_id, ()))
            if existing.get(doc.source_id, {}).get("row_hash") != row_hash:
                plan.todo.append(PlannedDoc(doc, kb.kb_id, row_hash, document_texts(doc)))
        if kb.complete:  # documents handed in by a program are upserted: the root may hold others
            plan.deletes += sorted(s for s, row in existing.items() if row["kb"] == kb.kb_id and s not in current)
    return plan


def embed_doc_texts(plan: DocVectorPlan, model: BaseEmbedding, batch_size: int) -> list[list[np.ndarray]]:
    """The title and summary vectors of each write batch of ``plan.todo`` (the model's two embedded kinds), each
    kind embedded as one :func:`embed_passages` call per write batch. Needs no Milvus: ingest embeds them while
    the chunks are still being written."""
    return [
        [embed_passages(model, [planned.texts[i] for planned in batch], batch_size) for i in range(len(KINDS) - 1)]
        for batch in plan.batches()
    ]


def plan_chunk_means(client: MilvusClient, settings: KBSettings, plan: DocVectorPlan) -> list[dict[str, np.ndarray]]:
    """The text vectors of each write batch of ``plan.todo``: the normalised mean of each document's chunk vectors as
    the collection holds them now (its chunks written already)."""
    return [_chunk_means(client, settings, [planned.doc for planned in batch]) for batch in plan.batches()]


def write_planned_doc_vectors(
    client: MilvusClient,
    settings: KBSettings,
    plan: DocVectorPlan,
    embedded: Sequence[Sequence[np.ndarray]],
    *,
    chunk_means: Sequence[Mapping[str, np.ndarray]] | None = None,
    static_model: StaticEmbedder | None = None,
    progress: bool = False,
) -> int:
    """Write ``plan``'s rows, their title and summary vectors ``embedded`` (:func:`embed_doc_texts`) and their text
    vectors ``chunk_means`` (:func:`plan_chunk_means`, else read here), then delete its ``deletes``; returns the rows
    written + deleted. ``static_model``: the static model, else loaded here."""
    name = doc_vectors_collection_name(settings)
    if chunk_means is None:
        chunk_means = plan_chunk_means(client, settings, plan)
    bar = progress_bar(len(plan.todo), "document vectors", "doc", enabled=progress)
    for batch, (titles, summaries), means in zip(plan.batches(), embedded, chunk_means, strict=True):
        # A document without chunk rows (none should be) gets its summary vector in their place.
        text_vectors = np.stack([means.get(p.doc.source_id, summaries[j]) for j, p in enumerate(batch)])
        static = static_model or load_static_embedder(settings.resolved_model_cache_dir())
        vectors = [titles, summaries, text_vectors, static.embed([p.texts[1] for p in batch])]
        rows = [
            {
                "source": p.doc.source_id,
                "kb": p.kb_id,
                "row_hash": p.row_hash,
                TITLE_FIELD: _fit(p.texts[0], TITLE_MAX_BYTES),
                TERMS_FIELD: document_terms(p.doc),
                VECTORS_FIELD: np.concatenate([v[j] for v in vectors]).tolist(),
            }
            for j, p in enumerate(batch)
        ]
        client.upsert(name, rows)
        bar.update(len(batch))
    bar.close()
    for start in range(0, len(plan.deletes), WRITE_BATCH):
        client.delete(name, ids=plan.deletes[start : start + WRITE_BATCH])
    return len(plan.todo) + len(plan.deletes)


def _chunk_means(client: MilvusClient, settings: KBSettings, docs: Sequence[KbDocument]) -> dict[str, np.ndarray]:
    """Normalised mean of each document's chunk vectors, as the collection holds them now (this version only)."""
    wanted = {doc.source_id: doc.content_hash for doc in docs}
    sums: dict[str, np.ndarray] = {}
    for start in range(0, len(docs), CHUNK_QUERY_DOCUMENTS):
        sources = [doc.source_id for doc in docs[start : start + CHUNK_QUERY_DOCUMENTS]]
        rows = rows_where(
            client,
            settings,
            in_expr(settings.schema_fields.source_field, sources),
            [
                settings.schema_fields.source_field,
                settings.schema_fields.vector_field,
                settings.schema_fields.metadata_field,
            ],
            consistency_level="Strong",
        )
        for row in rows:
            source = str(row[settings.schema_fields.source_field])
            if (row.get(settings.schema_fields.metadata_field) or {}).get("doc_hash") != wanted.get(source):
                continue
            vector = np.asarray(row[settings.schema_fields.vector_field], dtype=np.float32)
            sums[source] = sums[source] + vector if source in sums else vector
    return {source: normalise(total[np.newaxis, :])[0] for source, total in sums.items()}


class DocumentVectors:
    """The document vectors of a collection, in memory: source -> a (3, dim) array (title, summary, text) and,
    with a ``static_model``, source -> its static summary vector and, given ``titles`` and ``terms``, its title by
    the static model with words weighted by their rarity among the documents' terms.

    ``enabled`` is False, with the reason in ``off_reason``, for a collection without the companion (written by
    another tool or by a kb-retrieval from before document vectors) or with one of an older layout.
    """

    def __init__(
        self,
        vectors: dict[str, np.ndarray] | None = None,
        off_reason: str | None = None,
        *,
        static: dict[str, np.ndarray] | None = None,
        static_model: StaticEmbedder | None = None,
        titles: Mapping[str, str] | None = None,
        terms: Mapping[str, str] | None = None,
        common_min_documents: int = 0,
    ) -> None:
        self.sources = sorted(vectors or {})
        self.position = {source: i for i, source in enumerate(self.sources)}
        dim = next(iter(vectors.values())).shape[1] if vectors else 0
        self.matrix = (
            np.stack([vectors[s] for s in self.sources]) if vectors else np.zeros((0, len(KINDS), dim), np.float32)
        )
        self.static_model = static_model if static else None
        self.static = np.stack([static[s] for s in self.sources]) if static and self.sources else None
        self.term_weights: TermWeights | None = None
        self.static_titles: np.ndarray | None = None
        if self.static_model is not None and titles is not None and terms is not None and self.sources:
            self.term_weights = TermWeights(terms.get(s, "").split() for s in self.sources)
            self.static_titles = self.static_model.embed_weighted(
                [titles.get(s, "") for s in self.sources], self.term_weights
            )
        # The direction every static vector shares (see common_direction), one per static signal; None: kept.
        self.static_common: np.ndarray | None = None
        self.static_title_common: np.ndarray | None = None
        if common_min_documents and len(self.sources) >= common_min_documents:
            if self.static is not None:
                self.static_common = common_direction(self.static)
                self.static = without_direction(self.static, self.static_common)
            if self.static_titles is not None:
                self.static_title_common = common_direction(self.static_titles)
                self.static_titles = without_direction(self.static_titles, self.static_title_common)
        self.off_reason = off_reason

    @property
    def enabled(self) -> bool:
        return self.off_reason is None

    def __len__(self) -> int:
        return len(self.sources)

    @classmethod
    def load_from_milvus(cls, client: MilvusClient, settings: KBSettings) -> DocumentVectors:
        if off_reason := doc_vectors_off_reason(client, settings):
            return cls(off_reason=off_reason)
        name = doc_vectors_collection_name(settings)
        client.load_collection(name)
        model_part = len(KINDS) * settings.schema_fields.dim
        vectors: dict[str, np.ndarray] = {}
        static: dict[str, np.ndarray] = {}
        titles: dict[str, str] = {}
        terms: dict[str, str] = {}
        fields = ["source", TITLE_FIELD, TERMS_FIELD, VECTORS_FIELD]
        for row in iter_rows(client, settings, fields, collection=name):
            source = row["source"]
            stored = np.asarray(row[VECTORS_FIELD], dtype=np.float32)
            vectors[source] = normalise(stored[:model_part].reshape(len(KINDS), -1))
            static[source] = normalise(stored[np.newaxis, model_part:])[0]
            titles[source], terms[source] = row[TITLE_FIELD], row[TERMS_FIELD]
        return cls(
            vectors,
            static=static,
            static_model=load_static_embedder(settings.resolved_model_cache_dir()) if static else None,
            titles=titles,
            terms=terms,
            common_min_documents=settings.scoring.static_common_min_documents,
        )

    def similarities(
        self, query: Sequence[float], sources: Sequence[str], query_text: str | None = None
    ) -> dict[str, tuple[float, float, float, float, float]]:
        """Cosine similarity of the (normalised) query to each known source's title, summary and text vectors, and
        of ``query_text`` by the static model to its static summary vector and, words weighted by rarity, to its
        static title vector (0.0 without a text or those vectors); sources without vectors are left out."""
        known = [s for s in dict.fromkeys(sources) if s in self.position]
        if not known:
            return {}
        rows = [self.position[s] for s in known]
        sims = self.matrix[rows] @ normalise([query])[0]
        static = np.zeros(len(known), dtype=np.float32)
        static_title = np.zeros(len(known), dtype=np.float32)
        if self.static is not None and self.static_model is not None and query_text:
            plain = self.static_model.embed([query_text])
            if self.static_common is not None:
                plain = without_direction(plain, self.static_common)
            static = self.static[rows] @ plain[0]
            if self.static_titles is not None and self.term_weights is not None:
                weighted = self.static_model.embed_weighted([query_text], self.term_weights)
                if self.static_title_common is not None:
                    weighted = without_direction(weighted, self.static_title_common)
                static_title = self.static_titles[rows] @ weighted[0]
        # As Python floats in one go (``tolist``: the same values as ``float()`` of each element, a tenth the time).
        return {
            s: (row[0], row[1], row[2], st, tt)
            for s, row, st, tt in zip(known, sims.tolist(), static.tolist(), static_title.tolist(), strict=True)
        }


def common_direction(rows: np.ndarray) -> np.ndarray:
    """The unit direction the rows of ``rows`` share most: its first right singular vector, not centred (the second
    half of "smooth inverse frequency" sentence vectors, Arora et al. 2017), signed to agree with the rows' mean.

    A static model's text vector is a sum of word vectors, and what every text of one knowledge base says (the words
    of its domain and of runbook prose) adds one direction to all of them; cosine similarity then measures that
    direction as much as the query's own words. Removing it from documents and query alike leaves what tells the
    documents apart. Estimated only from enough documents (``ScoringProfile.static_common_min_documents``): from a
    handful, the first direction is one document's, not the corpus's.

    Example:
        >>> rows = np.array([[1.0, 0.1], [1.0, -0.1]], dtype=np.float32)
        >>> np.round(common_direction(rows), 3).tolist()
        [1.0, 0.0]
    """
    # The top eigenvector of the smaller Gram matrix, not an SVD: the same direction (float32-identical on the
    # runbooks' static vectors, 111 x 256) in a tenth of the time, which a CLI lookup pays at every start (an SVD
    # took 3 s there on a busy 2-core machine, LAPACK's threads waiting on each other).
    matrix = np.asarray(rows, dtype=np.float64)
    if matrix.shape[0] >= matrix.shape[1]:
        direction = np.linalg.eigh(matrix.T @ matrix)[1][:, -1]
    else:
        direction = matrix.T @ np.linalg.eigh(matrix @ matrix.T)[1][:, -1]
        direction /= np.linalg.norm(direction) or 1.0  # all rows zero: no direction to take out
    if float(direction @ rows.sum(axis=0)) < 0:
        direction = -direction
    return direction.astype(np.float32)


def without_direction(rows: np.ndarray, direction: np.ndarray) -> np.ndarray:
    """``rows`` with their component along the unit ``direction`` taken out, each renormalised (a zero row stays
    zero)."""
    rest = rows - (rows @ direction)[:, np.newaxis] * direction  # np.outer's product, without its Python
    return unit_rows(rest).astype(np.float32, copy=False)
