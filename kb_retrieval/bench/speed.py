"""Speed on this machine: warm lookup latency against the stock dense retriever on the same collection, ingest
throughput against raw embedding throughput, and lookup latency as the collection grows."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from kb_retrieval.config import Settings


def percentile(values: Sequence[float], q: float) -> float:
    return round(float(np.percentile(np.asarray(values), q)), 3)


def warm_latency(settings: Settings, queries: Sequence[str], embed_model: Any, rounds: int = 4) -> dict[str, Any]:
    """p50/p95 of ``lookup_knowledge`` and of a stock ``VectorIndexRetriever`` over the same collection, plus the
    mean of each pipeline stage.

    Both run in one process after a warm-up pass, in alternating blocks (all queries through one, then through the
    other; the order swaps every round), so slow drift of the machine hits both alike. Blocks, not query-by-query
    alternation: on 2 cores the thread pool one system leaves spinning after its call would slow the other's next
    call, which measures the neighbour rather than the system.
    """
    from llama_index.core import VectorStoreIndex

    from kb_retrieval.engine import KnowledgeLookup
    from kb_retrieval.retrieval.l1.vectorstore import make_vector_store

    lookup = KnowledgeLookup(settings, embed_model=embed_model)
    stock = VectorStoreIndex.from_vector_store(make_vector_store(settings), embed_model=embed_model).as_retriever(
        similarity_top_k=settings.top_k
    )
    for query in queries:  # warm-up: caches, first connections, lazy stores
        lookup.lookup(query)
        stock.retrieve(query)
    ours: list[float] = []
    theirs: list[float] = []
    stages: dict[str, list[float]] = {}

    def run_ours() -> None:
        for query in queries:
            t0 = time.perf_counter()
            result = lookup.lookup(query)
            ours.append((time.perf_counter() - t0) * 1000)
            for stage, ms in result.stage_ms.items():
                stages.setdefault(stage, []).append(ms)

    def run_stock() -> None:
        for query in queries:
            t0 = time.perf_counter()
            stock.retrieve(query)
            theirs.append((time.perf_counter() - t0) * 1000)

    for round_ in range(rounds):
        for block in (run_ours, run_stock) if round_ % 2 == 0 else (run_stock, run_ours):
            block()
    lookup.close()
    return {
        "queries": len(queries) * rounds,
        "query_encoder": lookup.query_embed_model.model_name,
        "lookup_knowledge_ms": {"p50": percentile(ours, 50), "p95": percentile(ours, 95)},
        "stock_dense_ms": {"p50": percentile(theirs, 50), "p95": percentile(theirs, 95)},
        "p50_ratio": round(percentile(ours, 50) / percentile(theirs, 50), 3),
        "stage_mean_ms": {k: round(statistics.fmean(v), 3) for k, v in sorted(stages.items())},
    }


def ingest_throughput(kb_root: Path, state_dir: Path, embed_model: Any) -> dict[str, Any]:
    """Chunks per second of a fresh ingest against embedding the same chunk texts alone (model already loaded)."""
    from kb_retrieval.indexing.embeddings import embed_texts
    from kb_retrieval.indexing.ingest import ingest
    from kb_retrieval.knowledge.chunker import chunk_document
    from kb_retrieval.knowledge.loader import load_knowledge_base

    settings = Settings(state_dir=state_dir)
    texts = [
        chunk.embedding_text()
        for doc in load_knowledge_base(kb_root).documents
        for chunk in chunk_document(doc, settings.chunk_tokens, settings.chunk_overlap)
    ]
    batch = settings.embed_batch_size * 4
    t0 = time.perf_counter()
    for start in range(0, len(texts), batch):
        embed_texts(embed_model, texts[start : start + batch])
    embed_s = time.perf_counter() - t0
    summary = ingest([kb_root], settings, embed_model=embed_model)
    return {
        "chunks": len(texts),
        "raw_embedding_chunks_per_s": round(len(texts) / embed_s, 2),
        "ingest_chunks_per_s": round(summary.chunks_embedded / summary.seconds, 2),
        "ratio": round(embed_s / summary.seconds, 3),
        "ingest_seconds": summary.seconds,
        "ingest_embed_seconds": summary.embed_seconds,
    }


def latency_at_scale(
    kb_root: Path,
    state_dir: Path,
    queries: Sequence[str],
    embed_model: Any,
    sizes: Sequence[int] = (1_000, 10_000, 100_000),
    log: Callable[[str], None] = print,
) -> list[dict[str, Any]]:
    """The real runbook chunks plus synthetic filler rows (random unit vectors) up to each size."""
    from kb_retrieval.engine import KnowledgeLookup
    from kb_retrieval.indexing.ingest import ingest
    from kb_retrieval.indexing.milvus import connect

    settings = Settings(state_dir=state_dir, collection="scale", vector_store_mode="sdk")
    summary = ingest([kb_root], settings, embed_model=embed_model)
    client = connect(settings)
    rows = summary.chunks_added + summary.chunks_unchanged
    rng = np.random.default_rng(7)
    out = []
    for size in sizes:
        while rows < size:
            n = min(10_000, size - rows)
            vectors = rng.standard_normal((n, settings.dim)).astype(np.float32)
            vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
            client.insert(
                settings.collection,
                [
                    {
                        "id": f"filler-{rows + i}",
                        "content": "synthetic filler",
                        "vector": vectors[i].tolist(),
                        "metadata": {"title": "filler"},
                        "category": "filler",
                        "source": f"filler/{(rows + i) // 10}.md",
                    }
                    for i in range(n)
                ],
            )
            rows += n
        # As ingest does after writing: Milvus Lite searches rows it has not flushed by brute force over a growing
        # segment (measured here: 10k unflushed rows ~500 ms per search, ~20 ms once flushed).
        client.flush(settings.collection)
        lookup = KnowledgeLookup(settings, embed_model=embed_model, client=client)
        for query in queries[:3]:
            lookup.lookup(query)
        times, search = [], []
        for query in queries:
            t0 = time.perf_counter()
            result = lookup.lookup(query)
            times.append((time.perf_counter() - t0) * 1000)
            search.append(result.stage_ms.get("search", 0.0))
        lookup.close()
        out.append(
            {
                "chunks": rows,
                "p50_ms": percentile(times, 50),
                "p95_ms": percentile(times, 95),
                "search_p50_ms": percentile(search, 50),
            }
        )
        log(f"[scale] {rows} chunks: p50 {out[-1]['p50_ms']} ms")
    return out
