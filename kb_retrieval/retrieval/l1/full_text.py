"""Dense and BM25 in one Milvus call: ``hybrid_search`` with a dense request and a BM25 (sparse) request.

Used when the engine and the collection have full-text search (``lexical_mode = milvus_bm25``: Milvus Lite 3.2,
Milvus >= 2.5; see :func:`kb_retrieval.indexing.milvus.full_text_off`). Both requests carry the same filter, and the
call returns the union of their hits (its limit is the sum of theirs). When the query holds a rare identifier
(:mod:`kb_retrieval.retrieval.exact`), a third request, dense and restricted to the chunks holding it, brings those
chunks in the same call, with their vectors, whether or not the dense or the BM25 request found them.

A fused score (RRF or weighted) is neither a cosine nor a BM25 score, so none is used as one. Each hit gets:

- its **dense score**, computed here from the chunk's vector (returned in the output fields) and the query
  embedding with the collection's metric: the value a dense search returns for that chunk (cosine, inner product,
  or squared L2 distance; equal to Milvus' to float32 precision), labelled and normalised as every path's;
- its **BM25 score**, from the ranker: ``WeightedRanker(0, 1[, 0], norm_score=False)`` makes the fused score exactly
  the raw BM25 score of the BM25 request (0 weight for the dense requests, no normalisation), and 0 for a chunk only
  a dense request returned. BM25 scores of real hits are positive, so a positive fused score means a BM25 hit.

Example:
    >>> request = HybridRequest(vec, "redi memori", top_k=20, lexical_top_k=20, filter_expr=None)  # doctest: +SKIP
    >>> hits = milvus_hybrid_search(client, settings, request, 5.0, "sdk")  # doctest: +SKIP
    >>> hits.bm25  # doctest: +SKIP
    {'3f2a...': 4.81, ...}
"""

from __future__ import annotations

from typing import Any

import numpy as np
from pymilvus import AnnSearchRequest, MilvusClient, WeightedRanker

from kb_retrieval.config import KBSettings
from kb_retrieval.indexing.milvus import search_params
from kb_retrieval.retrieval.l1.base import HybridRequest, L1Search, PathName, output_fields, to_candidate


def dense_scores(query: np.ndarray, vectors: Any, metric: str) -> np.ndarray:
    """What a dense search with ``metric`` returns for each row of ``vectors``: cosine or inner product
    (similarities), or the squared L2 distance (lower is better), computed in float32 as Milvus does.

    Example:
        >>> dense_scores(np.array([1.0, 0.0], dtype=np.float32), [[0.6, 0.8], [0.0, 2.0]], "COSINE").tolist()
        [0.6000000238418579, 0.0]
    """
    v = np.asarray(vectors, dtype=np.float32).reshape(-1, len(query))
    metric = metric.upper()
    if metric == "L2":
        return np.sum((v - query) ** 2, axis=1)
    # einsum, not BLAS: a row's value does not depend on how many rows are scored with it (a BLAS matrix-vector
    # product's does, in the last bit), so the memory plan and a Milvus search give a chunk the same score.
    dots = np.einsum("ij,j->i", v, query)
    if metric == "IP":
        return dots
    norms = np.linalg.norm(v, axis=1) * np.linalg.norm(query)
    return np.divide(dots, norms, out=np.zeros_like(dots), where=norms > 0)


def dense_score(query: np.ndarray, vector: Any, metric: str) -> float:
    """:func:`dense_scores` of one vector.

    Example:
        >>> round(dense_score(np.array([1.0, 0.0], dtype=np.float32), [0.6, 0.8], "COSINE"), 6)
        0.6
    """
    return float(dense_scores(query, [vector], metric)[0])


def milvus_hybrid_search(
    client: MilvusClient, settings: KBSettings, request: HybridRequest, timeout: float | None, path: PathName
) -> L1Search:
    """One ``hybrid_search`` for ``request`` (:class:`~kb_retrieval.retrieval.l1.base.HybridRequest`; its ``terms`` an
    analysed query, :func:`kb_retrieval.retrieval.bm25.analysed_text`).

    Returns every hit of any request as a candidate with its dense score, and ``bm25`` with the raw BM25 score of
    each BM25 hit. Candidates come in Milvus' order (BM25 hits first); the caller orders them.
    """
    embedding, terms, expr = request.embedding, request.terms, request.filter_expr or ""
    requests = [_dense_request(settings, embedding, request.top_k, expr)]
    weights = [0.0]
    if terms and request.lexical_top_k > 0:
        requests.append(
            AnnSearchRequest(
                data=[terms],
                anns_field=settings.schema_fields.sparse_field,
                param={"metric_type": "BM25"},
                limit=request.lexical_top_k,
                expr=expr,
            )
        )
        weights.append(1.0)
    if request.ids_filter and request.ids_count > 0:
        requests.append(_dense_request(settings, embedding, request.ids_count, request.ids_filter))
        weights.append(0.0)
    hits = client.hybrid_search(
        settings.storage.collection,
        requests,
        ranker=WeightedRanker(*weights, norm_score=False),
        limit=sum(r.limit for r in requests),
        output_fields=[*output_fields(settings), settings.schema_fields.vector_field],
        timeout=settings.storage.milvus_search_timeout_s if timeout is None else timeout,
    )[0]
    result = L1Search(path=path)
    if not hits:
        return result
    # One matrix product for every hit (one at a time cost ~0.05 ms a hit on this machine).
    scores = dense_scores(
        np.asarray(embedding, dtype=np.float32),
        [hit["entity"][settings.schema_fields.vector_field] for hit in hits],
        settings.schema_fields.metric,
    )
    for hit, score in zip(hits, scores.tolist(), strict=True):
        fields = hit["entity"]
        chunk_id = str(hit["id"])
        result.candidates.append(
            to_candidate(
                settings,
                chunk_id=chunk_id,
                raw_score=score,
                fields=fields,
                content=fields.get(settings.schema_fields.content_field, ""),
                path=path,
            )
        )
        if float(hit["distance"]) > 0:
            result.bm25[chunk_id] = float(hit["distance"])
    return result


def fetched_and_scored(
    client: MilvusClient, settings: KBSettings, embedding: list[float], expr: str, timeout: float | None, path: PathName
) -> tuple[L1Search, dict[str, np.ndarray]]:
    """The chunks ``expr`` selects (an id list under the lookup's filters), read by key with their vectors and given
    their dense score here (:func:`dense_scores`), best first: what a dense search restricted to them returns, to
    float32 precision; and each chunk's vector (float32), for the caller to keep."""
    rows = client.query(
        settings.storage.collection,
        filter=expr,
        output_fields=[*output_fields(settings), settings.schema_fields.vector_field],
        timeout=settings.storage.milvus_search_timeout_s if timeout is None else timeout,
    )
    result = L1Search(path=path)
    if not rows:
        return result, {}
    vectors = np.asarray([row.pop(settings.schema_fields.vector_field) for row in rows], dtype=np.float32)
    scores = dense_scores(np.asarray(embedding, dtype=np.float32), vectors, settings.schema_fields.metric)
    kept: dict[str, np.ndarray] = {}
    for i in np.argsort(scores if settings.schema_fields.metric.upper() == "L2" else -scores, kind="stable").tolist():
        row, chunk_id = rows[i], str(rows[i][settings.schema_fields.id_field])
        kept[chunk_id] = vectors[i]
        result.candidates.append(
            to_candidate(
                settings,
                chunk_id=chunk_id,
                raw_score=float(scores[i]),
                fields=row,
                content=row.get(settings.schema_fields.content_field, ""),
                path=path,
            )
        )
    return result, kept


def _dense_request(settings: KBSettings, embedding: list[float], limit: int, expr: str) -> AnnSearchRequest:
    return AnnSearchRequest(
        data=[embedding],
        anns_field=settings.schema_fields.vector_field,
        param=search_params(settings, limit),
        limit=limit,
        expr=expr,
    )
