"""Speed on this machine: warm lookup latency against the stock dense retriever on the same collection, ingest
throughput against raw embedding throughput, and lookup latency as the collection grows.

Size: over 400 lines: every speed figure of the bench, one function each, sharing the measuring helpers.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from kb_retrieval.config import KBSettings


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile of ``values`` (numpy's), rounded to three decimals."""
    return round(float(np.percentile(np.asarray(values), q)), 3)


def warm_latency(
    settings: KBSettings, query_sets: Mapping[str, Sequence[str]], embed_model: Any, rounds: int = 4
) -> dict[str, Any]:
    """Per query set (e.g. ``{"alerts": [...], "questions": [...]}``): p50/p95 of ``lookup_knowledge`` and of a stock
    ``VectorIndexRetriever`` over the same collection, twice: torch with its default threads and pinned to one
    (under load the default's threads contend and it collapses, which flatters us), their p50 ratios, each stage's
    p50 and mean, and what no stage clock covered (``elapsed_ms`` less the stages before the trace write).

    All run in one process after a warm-up pass, in alternating blocks (all queries of a set through one system, then
    the next; the order rotates every round), so slow drift of the machine hits them alike. Blocks, not
    query-by-query alternation: on 2 cores the thread pool one system leaves spinning after its call would slow the
    other's next call, which measures the neighbour rather than the system. Each query runs ``rounds`` times; nothing
    on the lookup path caches a query's vector or result, so a repeat costs what the first run did (``embed`` in the
    stages is the encoder's cost on every call).
    """
    import torch
    from llama_index.core import VectorStoreIndex

    from kb_retrieval.engine import KnowledgeLookup
    from kb_retrieval.retrieval.l1.vectorstore import make_vector_store

    lookup = KnowledgeLookup(settings)  # queries embedded as a user's are (ONNX)
    stock = VectorStoreIndex.from_vector_store(make_vector_store(settings), embed_model=embed_model).as_retriever(
        similarity_top_k=settings.retrieval.top_k
    )
    threads = torch.get_num_threads()

    def stock_with(count: int) -> Callable[[str], Any]:
        def run(query: str) -> Any:
            torch.set_num_threads(count)
            return stock.retrieve(query)

        return run

    figures: dict[str, Any] = {
        "query_encoder": lookup.query_embed_model.model_name,
        "lookup_plan": lookup.plan,
        "rounds": rounds,
        "stock_torch_threads": threads,
    }
    try:
        for name, queries in query_sets.items():
            figures[name] = _warm_latency_of_set(
                lookup.lookup,
                {"stock_dense": stock_with(threads), "stock_dense_1_thread": stock_with(1)},
                queries,
                rounds,
            )
    finally:
        torch.set_num_threads(threads)
        lookup.close()
    return figures


def _warm_latency_of_set(
    ours_fn: Callable[[str], Any], stock_fns: Mapping[str, Callable[[str], Any]], queries: Sequence[str], rounds: int
) -> dict[str, Any]:
    for query in queries:  # warm-up: caches, first connections, lazy stores
        ours_fn(query)
        for fn in stock_fns.values():
            fn(query)
    ours: list[float] = []
    theirs: dict[str, list[float]] = {name: [] for name in stock_fns}
    stages: dict[str, list[float]] = {}
    unclocked: list[float] = []

    def run_ours() -> None:
        for query in queries:
            t0 = time.perf_counter()
            result = ours_fn(query)
            ours.append((time.perf_counter() - t0) * 1000)
            for stage, ms in result.stage_ms.items():
                stages.setdefault(stage, []).append(ms)
            clocked = sum(ms for stage, ms in result.stage_ms.items() if stage != "trace_write")
            unclocked.append(result.elapsed_ms - clocked)

    def run_stock(name: str) -> Callable[[], None]:
        def run() -> None:
            for query in queries:
                t0 = time.perf_counter()
                stock_fns[name](query)
                theirs[name].append((time.perf_counter() - t0) * 1000)

        return run

    blocks = [run_ours, *(run_stock(name) for name in stock_fns)]
    for round_ in range(rounds):
        for block in blocks[round_ % len(blocks) :] + blocks[: round_ % len(blocks)]:
            block()
    figures: dict[str, Any] = {
        "queries": len(queries) * rounds,
        "distinct_queries": len(set(queries)),
        "lookup_knowledge_ms": {"p50": percentile(ours, 50), "p95": percentile(ours, 95)},
    }
    for name, times in theirs.items():
        figures[f"{name}_ms"] = {"p50": percentile(times, 50), "p95": percentile(times, 95)}
        suffix = name.removeprefix("stock_dense")
        figures[f"p50_ratio{suffix}"] = round(percentile(ours, 50) / percentile(times, 50), 3)
    figures["stage_p50_ms"] = {k: percentile(v, 50) for k, v in sorted(stages.items())}
    figures["stage_mean_ms"] = {k: round(statistics.fmean(v), 3) for k, v in sorted(stages.items())}
    figures["unclocked_ms"] = {"p50": percentile(unclocked, 50), "max": round(max(unclocked), 3)}
    return figures


#: Runs a command as a child of a small process and reports its wall time and peak RSS. A child this (large)
#: process started directly would report this process's peak as its own: at exec, Linux keeps the pre-exec memory's
#: high-water mark in the child's ``ru_maxrss``, and CPython starts children by vfork, sharing this process's memory
#: until then (measured: a 600 MiB parent, ``python -c pass`` reported 614 MiB directly, 13 MiB this way).
_LAUNCHER = """
import os, sys, time
out, sink, command = sys.argv[1], sys.argv[2], sys.argv[3:]
t0 = time.perf_counter()
pid = os.fork()
if pid == 0:
    os.dup2(os.open(sink, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), 1)
    os.execv(command[0], command)
_, status, usage = os.wait4(pid, 0)
with open(out, "w") as handle:
    handle.write(f"{time.perf_counter() - t0} {usage.ru_maxrss} {os.waitstatus_to_exitcode(status)}")
"""


def whole_process(command: Sequence[str], *, stdout: Path | None = None) -> tuple[float, float]:
    """``command`` as a whole process: (wall seconds, peak RSS in MiB), measured from a small launcher process (see
    ``_LAUNCHER``: its own ~10 MiB is the floor of the figure). Its stdout goes into the file ``stdout`` (discarded
    when None). Raises when it fails."""
    import os
    import subprocess
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "measured"
        errors = Path(folder) / "stderr"
        sink = str(stdout) if stdout is not None else os.devnull
        with open(errors, "wb") as said:  # a file, not a pipe: nothing read until the process ends
            launch = [sys.executable, "-I", "-S", "-c", _LAUNCHER, str(out), sink, *command]
            subprocess.run(launch, stderr=said, check=True)
        wall_s, peak_kib, code = out.read_text().split()
        if int(code) != 0:
            tail = errors.read_text(errors="replace").strip()[-500:]
            raise RuntimeError(f"{' '.join(command[1:3])} exited with {code}: {tail}")
    return float(wall_s), int(peak_kib) / 1024  # ru_maxrss is in KiB on Linux


def start_up(settings: KBSettings, embed_model: Any, query: str, *, runs: int = 5) -> dict[str, Any]:
    """How long a ``KnowledgeLookup`` takes to build (the model already loaded: what a process pays after its
    imports), and a CLI lookup as a whole process from nothing: wall time and peak memory (median of ``runs``)."""
    import sys

    from kb_retrieval.engine import KnowledgeLookup

    builds = []
    for _ in range(runs):
        t0 = time.perf_counter()
        lookup = KnowledgeLookup(settings)  # queries embedded as a user's are (ONNX)
        builds.append(time.perf_counter() - t0)
        lookup.close()
    from kb_retrieval.indexing.milvus import release_lite

    release_lite(settings)  # Milvus Lite opens a data dir in one process only: the CLI's, from here on
    script = Path(sys.executable).parent / "kb-retrieval"
    command = [str(script), "lookup", "--state-dir", str(settings.storage.state_dir), "--json", query]
    walls, peaks = [], []
    for _ in range(runs):
        wall_s, peak_mib = whole_process(command)
        walls.append(wall_s)
        peaks.append(peak_mib)
    return {
        "lookup_build_s": round(statistics.median(builds), 3),
        "cli_lookup_wall_s": round(statistics.median(walls), 2),
        "cli_lookup_peak_rss_mb": round(statistics.median(peaks), 1),
        "runs": runs,
    }


def ingest_throughput(kb_root: Path, state_dir: Path, embed_model: Any, *, runs: int = 3) -> dict[str, Any]:
    """A fresh ``kb-retrieval ingest`` of ``kb_root`` against two references measured in the same run.

    - The floor: the same encoder (the sorted fp32 ONNX passage encoder, loaded) embedding the same texts alone,
      every chunk's and each document's title and summary (its document vectors). ``ratio`` is the floor's seconds
      over ingest's own (``ingest_seconds``: inside the command, its imports excluded): ingest's overhead.
    - The stock path (issue 39): the corpus chunked as the bench's stock retrievers chunk it
      (:func:`~kb_retrieval.bench.stock.stock_nodes`), embedded only (no vector store) by ``embed_model`` (the
      bench's ``HuggingFaceEmbedding``, torch) as ``VectorStoreIndex`` embeds nodes: ``embed_nodes`` over batches of
      its default ``insert_batch_size``. ``stock_ratio`` is the whole command's wall time (a process from nothing,
      imports and model load included) over the stock embedding's seconds.

    Ingest runs ``runs`` times as a command of its own, each into a fresh state dir under ``state_dir``, with the
    floor measured between them (floor, ingest, floor, ingest...) and the stock embedding once, mid-way; the
    medians are reported, so one slow moment of a shared machine moves none of the figures. A 100k-chunk knowledge
    base's ingest time is projected from the median rate.
    """
    import json
    import shutil
    import sys

    from kb_retrieval.indexing.model_check import model_id
    from kb_retrieval.indexing.onnx_query import passage_encoder

    settings = KBSettings(state_dir=state_dir)
    encoder = passage_encoder(settings)
    texts, doc_texts = _ingest_texts(kb_root, settings)
    script = Path(sys.executable).parent / "kb-retrieval"
    state_dir.mkdir(parents=True, exist_ok=True)
    floors: list[float] = []
    walls: list[float] = []
    summaries: list[dict[str, Any]] = []
    stock: dict[str, Any] = {}
    for run in range(runs):
        floors.append(_floor_seconds(encoder, texts, doc_texts, settings.embedding.embed_batch_size))
        if run == runs // 2:
            stock = stock_embedding(kb_root, embed_model)
        fresh = state_dir / f"run-{run}"
        shutil.rmtree(fresh, ignore_errors=True)
        printed = state_dir / f"run-{run}.json"
        command = [str(script), "ingest", str(kb_root), "--state-dir", str(fresh), "--json"]
        wall_s, _ = whole_process(command, stdout=printed)
        walls.append(wall_s)
        summaries.append(json.loads(printed.read_text(encoding="utf-8")))
        shutil.rmtree(fresh, ignore_errors=True)
    seconds = statistics.median(s["seconds"] for s in summaries)
    embed_seconds = statistics.median(s["embed_seconds"] for s in summaries)
    chunks = summaries[0]["chunks_embedded"]
    floor_s, wall_s = statistics.median(floors), statistics.median(walls)
    return {
        "chunks": chunks,
        "encoder": type(encoder).__name__ + f" ({model_id(encoder)})",
        "runs": runs,
        "raw_embedding_chunks_per_s": round(len(texts) / floor_s, 2),
        "ingest_chunks_per_s": round(chunks / seconds, 2),
        "ratio": round(floor_s / seconds, 3),
        "ingest_seconds": round(seconds, 3),
        "ingest_embed_seconds": round(embed_seconds, 3),
        "ingest_beyond_embedding_seconds": round(seconds - embed_seconds, 3),
        "cli_ingest_wall_s": round(wall_s, 2),
        "cli_ingest_wall_s_runs": [round(w, 2) for w in walls],
        **stock,
        "stock_ratio": round(wall_s / stock["stock_torch_embedding_seconds"], 3),
        "projected_100k_chunks_minutes": round(100_000 / (chunks / seconds) / 60, 1),
    }


def _ingest_texts(kb_root: Path, settings: KBSettings) -> tuple[list[str], list[tuple[str, str]]]:
    """What ingest embeds for ``kb_root``: every chunk's text, and each document's (title, summary)."""
    from kb_retrieval.indexing.doc_vectors import document_texts
    from kb_retrieval.indexing.embeddings import word_piece_limit
    from kb_retrieval.knowledge.chunker import chunk_document
    from kb_retrieval.knowledge.loader import load_knowledge_base

    documents = load_knowledge_base(kb_root).documents
    limit = word_piece_limit(settings.embedding.embed_model)
    texts = [
        chunk.embedding_text()
        for doc in documents
        for chunk in chunk_document(doc, settings.chunking.chunk_tokens, settings.chunking.chunk_overlap, limit)
    ]
    return texts, [document_texts(doc) for doc in documents]


def _floor_seconds(encoder: Any, texts: list[str], doc_texts: list[tuple[str, str]], batch_size: int) -> float:
    """Seconds the loaded encoder takes to embed what ingest embeds, as ingest batches it."""
    from kb_retrieval.indexing.embeddings import embed_passages

    t0 = time.perf_counter()
    embed_passages(encoder, texts, batch_size)
    for kind in range(2):  # as ingest embeds them: titles, then summaries
        embed_passages(encoder, [t[kind] for t in doc_texts], batch_size)
    return time.perf_counter() - t0


def stock_embedding(kb_root: Path, embed_model: Any) -> dict[str, Any]:
    """Seconds the stock LlamaIndex path spends only embedding ``kb_root``: the bench's stock chunking, then
    ``VectorStoreIndex``'s own ``embed_nodes`` over batches of its default ``insert_batch_size`` (the model batches
    by its ``embed_batch_size``). The documents are read and chunked before the clock starts."""
    import inspect

    from llama_index.core import VectorStoreIndex
    from llama_index.core.indices.utils import embed_nodes
    from llama_index.core.utils import iter_batch

    from kb_retrieval.bench.stock import read_documents, stock_nodes

    nodes = stock_nodes(read_documents([kb_root]))
    insert_batch = inspect.signature(VectorStoreIndex.__init__).parameters["insert_batch_size"].default
    t0 = time.perf_counter()
    for batch in iter_batch(nodes, insert_batch):
        embed_nodes(batch, embed_model)
    seconds = time.perf_counter() - t0
    return {
        "stock_chunks": len(nodes),
        "stock_embed_model": f"{type(embed_model).__name__} (embed_batch_size {embed_model.embed_batch_size})",
        "stock_torch_embedding_seconds": round(seconds, 2),
    }


def latency_at_scale(
    kb_root: Path,
    state_dir: Path,
    queries: Sequence[str],
    embed_model: Any,
    sizes: Sequence[int] = (1_000, 10_000, 100_000),
    log: Callable[[str], None] = print,
    *,
    milvus_uri: str | None = None,
    collection: str = "scale",
) -> list[dict[str, Any]]:
    """Lookup latency as the collection grows: the real runbook chunks plus synthetic filler rows (random unit
    vectors) up to each size, on Milvus Lite (``milvus_uri`` None: a data dir under ``state_dir``) or a server.

    Per size, after a warm-up pass and with each query twice: lookup p50/p95 and the search stage's p50; the raw
    vector search alone (p50) and its recall@20 against an exact search over the same vectors (optimistic: random
    filler is far from every query); the cost of one :func:`index_version` check; how long a new
    ``KnowledgeLookup`` took to build, the first one for the index version (it reads every chunk) and a second (in
    this process: the model already loaded) that loads the snapshot the first one wrote. On a server the figures are
    taken once every row is indexed.
    """
    return _grow_and_measure(kb_root, state_dir, queries, embed_model, sizes, log, milvus_uri, collection)


def server_scale(
    kb_root: Path,
    state_dir: Path,
    queries: Sequence[str],
    embed_model: Any,
    milvus_uri: str,
    sizes: Sequence[int] = (1_000, 10_000, 100_000),
    log: Callable[[str], None] = print,
    *,
    collection: str = "kb_bench_scale",
) -> dict[str, Any]:
    """Scale on a Milvus server: the index it built, ingest throughput into it, filler insert rate, and
    :func:`latency_at_scale` at each size."""
    from kb_retrieval.indexing.milvus import vector_index

    settings = _scale_settings(state_dir, milvus_uri, collection)
    index_type, params = vector_index(settings, lite=False)
    figures: dict[str, Any] = {"index": {"type": index_type, "params": params}}
    figures["sizes"] = _grow_and_measure(
        kb_root, state_dir, queries, embed_model, sizes, log, milvus_uri, collection, figures=figures
    )
    figures["targets"] = server_targets(figures["sizes"])
    return figures


def server_targets(sizes: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The server's figures against issue 21's: lookup p50 over (query embedding + raw vector search) at the smallest
    size (at most 2), the largest size's p50 over the smallest's (at most 1.5), and p95 over p50 at each (at most 3).
    The embedding is the lookup's own ``embed`` stage (its mean: the stage p50 is not recorded per size)."""
    if not sizes:
        return {}
    first, last = sizes[0], sizes[-1]

    def over_search(size: Mapping[str, Any]) -> float:
        floor = size["stage_mean_ms"].get("embed", 0.0) + size["raw_search_p50_ms"]
        return round(size["p50_ms"] / floor, 3) if floor else float("inf")

    return {
        "p50_over_embed_plus_search": {str(s["chunks"]): over_search(s) for s in sizes},
        "p50_largest_over_smallest": round(last["p50_ms"] / first["p50_ms"], 3),
        "p95_over_p50": {str(s["chunks"]): round(s["p95_ms"] / s["p50_ms"], 3) for s in sizes},
    }


def _scale_settings(state_dir: Path, milvus_uri: str | None, collection: str) -> KBSettings:
    """The default settings on Milvus Lite (the memory plan); the sdk path on a server (the milvus plan)."""
    return KBSettings(
        state_dir=state_dir,
        collection=collection,
        vector_store_mode="sdk" if milvus_uri else "auto",
        milvus_uri=milvus_uri,
    )


def _grow_and_measure(
    kb_root: Path,
    state_dir: Path,
    queries: Sequence[str],
    embed_model: Any,
    sizes: Sequence[int],
    log: Callable[[str], None],
    milvus_uri: str | None,
    collection: str,
    *,
    figures: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    from kb_retrieval.engine import KnowledgeLookup
    from kb_retrieval.indexing.embeddings import embed_query
    from kb_retrieval.indexing.index_version import index_version, publish_version, version_content
    from kb_retrieval.indexing.ingest import ingest
    from kb_retrieval.indexing.milvus import connect, full_text_off, is_lite_engine, iter_rows, search_params

    settings = _scale_settings(state_dir, milvus_uri, collection)
    summary = ingest([kb_root], settings, embed_model=embed_model)
    client = connect(settings)
    lite = is_lite_engine(client, settings)
    full_text = full_text_off(client, settings) is None
    if figures is not None:
        figures["ingest"] = {
            "chunks": summary.chunks_embedded,
            "ingest_chunks_per_s": round(summary.chunks_embedded / summary.seconds, 2),
            "ingest_seconds": summary.seconds,
            "embed_seconds": summary.embed_seconds,
            "write_seconds": round(summary.seconds - summary.embed_seconds, 3),
        }
        log(f"[scale] ingest on the server: {figures['ingest']}")
    ids: list[str] = []
    blocks: list[np.ndarray] = []
    words: list[str] = []  # the corpus' own words: filler text that BM25 and the exact-identifier index must read
    for row in iter_rows(
        client,
        settings,
        [settings.schema_fields.id_field, settings.schema_fields.vector_field, settings.schema_fields.content_field],
    ):
        ids.append(row[settings.schema_fields.id_field])
        blocks.append(np.asarray([row[settings.schema_fields.vector_field]], dtype=np.float32))
        words.extend(row[settings.schema_fields.content_field].split())
    rows = len(ids)
    query_vectors = np.asarray([embed_query(embed_model, q) for q in queries], dtype=np.float32)
    rng = np.random.default_rng(7)
    insert_seconds = flush_seconds = 0.0
    inserted = 0
    out = []
    for size in sizes:
        t0 = time.perf_counter()
        while rows < size:
            n = min(10_000, size - rows)
            vectors = rng.standard_normal((n, settings.schema_fields.dim)).astype(np.float32)
            vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
            texts = [" ".join(rng.choice(words, size=FILLER_WORDS)) for _ in range(n)]
            batch = [_filler_row(settings, rows + i, vectors[i], texts[i], full_text) for i in range(n)]
            client.insert(settings.storage.collection, batch)
            ids.extend(f"filler-{rows + i}" for i in range(n))
            blocks.append(vectors)
            rows += n
            inserted += n
        # As ingest does after writing: Milvus Lite searches rows it has not flushed by brute force over a growing
        # segment (measured here: 10k unflushed rows ~500 ms per search, ~20 ms once flushed). A server flushes on
        # its own, but the figures are meant for a collection whose every row is indexed.
        insert_seconds += time.perf_counter() - t0
        t0 = time.perf_counter()
        client.flush(settings.storage.collection)
        flush_seconds += time.perf_counter() - t0
        index_seconds = 0.0 if lite else _wait_until_indexed(client, settings)
        # A writer publishes a new index version after its writes, as ingest does: the lookup objects' state
        # (and its snapshot) follow the version.
        publish_version(client, settings, content=version_content(index_version(client, settings)), wrote=True)
        t0 = time.perf_counter()
        lookup = KnowledgeLookup(settings, client=client)  # queries embedded as a user's are (ONNX)
        build_s = time.perf_counter() - t0
        build_source = lookup.state_source
        lookup.close()
        # A later process's start: the same version, so the state comes from the snapshot the first one wrote.
        t0 = time.perf_counter()
        lookup = KnowledgeLookup(settings, client=client)
        rebuild_s = time.perf_counter() - t0
        rebuild_source = lookup.state_source
        for query in queries:  # warm-up: caches, connections, the query encoder's first calls
            lookup.lookup(query)
        times, search = [], []
        stages: dict[str, list[float]] = {}
        for query in [*queries, *queries]:
            t0 = time.perf_counter()
            result = lookup.lookup(query)
            times.append((time.perf_counter() - t0) * 1000)
            search.append(result.stage_ms.get("search", 0.0))
            for stage, ms in result.stage_ms.items():
                stages.setdefault(stage, []).append(ms)
        lookup.close()
        raw_ms, recall = _raw_search(client, settings, query_vectors, np.concatenate(blocks), ids, search_params)
        version_ms = []
        for _ in range(50):
            t0 = time.perf_counter()
            index_version(client, settings)
            version_ms.append((time.perf_counter() - t0) * 1000)
        out.append(
            {
                "chunks": rows,
                "p50_ms": percentile(times, 50),
                "p95_ms": percentile(times, 95),
                "search_p50_ms": percentile(search, 50),
                "stage_mean_ms": {k: round(statistics.fmean(v), 3) for k, v in sorted(stages.items())},
                "raw_search_p50_ms": raw_ms,
                "recall@20": recall,
                "index_version_p50_ms": percentile(version_ms, 50),
                "lookup_build_s": round(build_s, 2),
                "lookup_build_state": build_source,
                "lookup_rebuild_s": round(rebuild_s, 2),
                "lookup_rebuild_state": rebuild_source,
                "index_wait_s": round(index_seconds, 1),
            }
        )
        log(f"[scale] {'lite' if lite else 'server'} {rows} chunks: {out[-1]}")
    if figures is not None and inserted:
        figures["filler_insert_rows_per_s"] = round(inserted / insert_seconds, 1)
        figures["filler_flush_seconds"] = round(flush_seconds, 1)
    return out


#: Words of text in each filler row, drawn from the corpus' own words (a chunk of the runbooks holds ~100-150).
FILLER_WORDS = 120


def _filler_row(settings: KBSettings, number: int, vector: np.ndarray, text: str, full_text: bool) -> dict[str, Any]:
    """A synthetic chunk: a random unit vector and text of the corpus' words, analysed for BM25 as ingest does."""
    from kb_retrieval.retrieval.bm25 import analysed_text, lexical_document

    row = {
        settings.schema_fields.id_field: f"filler-{number}",
        settings.schema_fields.content_field: text,
        settings.schema_fields.vector_field: vector.tolist(),
        settings.schema_fields.metadata_field: {"title": f"filler {number // 10}"},
        settings.schema_fields.category_field: "filler",
        settings.schema_fields.source_field: f"filler/{number // 10}.md",
    }
    if full_text:
        row[settings.schema_fields.lexical_text_field] = analysed_text(
            lexical_document(f"filler {number // 10}", None, text)
        )
    return row


def _wait_until_indexed(client: Any, settings: KBSettings, timeout_s: float = 900) -> float:
    """Seconds until the server reports no row waiting for the vector index (segments are indexed once sealed)."""
    started = time.perf_counter()
    while time.perf_counter() - started < timeout_s:
        info = client.describe_index(settings.storage.collection, settings.schema_fields.vector_field) or {}
        if int(info.get("pending_index_rows", 0)) == 0 and info.get("state", "Finished") == "Finished":
            break
        time.sleep(1)
    return time.perf_counter() - started


def _raw_search(
    client: Any,
    settings: KBSettings,
    queries: np.ndarray,
    vectors: np.ndarray,
    ids: list[str],
    search_params: Callable[[KBSettings, int], dict[str, Any]],
    k: int = 20,
) -> tuple[float, float]:
    """p50 ms of the vector search alone (top ``k``), and its recall@k against an exact search (vectors are unit
    length, so COSINE is the dot product)."""
    exact = np.argsort(-(queries @ vectors.T), axis=1)[:, :k]
    times, found = [], 0
    for query, truth in zip(queries, exact, strict=True):
        t0 = time.perf_counter()
        hits = client.search(
            settings.storage.collection,
            data=[query.tolist()],
            anns_field=settings.schema_fields.vector_field,
            limit=k,
            search_params=search_params(settings, k),
            output_fields=[settings.schema_fields.id_field],
        )[0]
        times.append((time.perf_counter() - t0) * 1000)
        found += len({hit["id"] for hit in hits} & {ids[i] for i in truth})
    return percentile(times, 50), round(found / (k * len(queries)), 4)
