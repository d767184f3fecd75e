"""``kb-retrieval stats``: what the collection and the L0 index hold, and how a lookup would run on them."""

from __future__ import annotations

import argparse
import json
from typing import Any

from kb_retrieval.cli.common import require_knowledge_base
from kb_retrieval.cli_args import add_location_arguments, settings_from_args


def run(args: argparse.Namespace) -> int:
    """Print the collection's figures (``--json``: one object)."""
    from kb_retrieval.indexing.doc_vectors import doc_vectors_collection_name, doc_vectors_off_reason
    from kb_retrieval.indexing.l0_index import L0Index
    from kb_retrieval.indexing.milvus import connect, count_rows, ensure_collection, features_off
    from kb_retrieval.retrieval.hybrid import choose_lexical_mode
    from kb_retrieval.retrieval.l1.memory import choose_plan, estimated_mirror_mb

    settings = settings_from_args(args)
    require_knowledge_base(settings)
    client = connect(settings)
    ensure_collection(client, settings, create=False)
    l0 = L0Index.load_from_milvus(client, settings)
    off = features_off(client, settings)
    if not l0.enabled:
        off["l0_hints"] = l0.off_reason or "no L0 index"
    lexical_mode, lexical_reason = choose_lexical_mode(client, settings, None)
    if lexical_reason:
        off["milvus_bm25"] = lexical_reason
    chunks = count_rows(client, settings)
    plan, plan_reason = choose_plan(client, settings, custom_path=False)
    if plan == "memory" and estimated_mirror_mb(chunks, settings) > settings.retrieval.memory_plan_max_mb:
        plan, plan_reason = (
            "milvus",
            f"the mirror would pass memory_plan_max_mb ({settings.retrieval.memory_plan_max_mb:g} MB)",
        )
    # Counted, not read: the vectors themselves are for lookups.
    doc_vectors_off = doc_vectors_off_reason(client, settings)
    if doc_vectors_off:
        off["document_ranking"] = doc_vectors_off
    docs_name = doc_vectors_collection_name(settings)
    doc_vectors = 0 if doc_vectors_off else count_rows(client, settings, collection=docs_name)
    categories: dict[str, int] = {}
    for entry in l0.documents.values():
        key = entry.category or "(none)"
        categories[key] = categories.get(key, 0) + 1
    stats: dict[str, Any] = {
        "collection": settings.storage.collection,
        "milvus": "server" if settings.is_milvus_server() else "lite",
        "uri": settings.mask(settings.resolved_milvus_uri()),
        "chunks": chunks,
        "documents": len(l0.documents),
        "knowledge_bases": len({e.kb for e in l0.documents.values()}),
        "categories": dict(sorted(categories.items())),
        "metric": settings.schema_fields.metric,
        "dim": settings.schema_fields.dim,
        "lexical_mode": lexical_mode,
        "lookup_plan": plan,
        "lookup_plan_reason": plan_reason,
        "document_vectors": doc_vectors,
        "features_off": dict(sorted(off.items())),
        "scoring_profile": settings.scoring.version,
    }
    if args.json:
        print(json.dumps(stats, sort_keys=True))
        return 0
    kind = "Milvus server" if stats["milvus"] == "server" else "Milvus Lite"
    rows = [
        ("collection", f"{stats['collection']} ({kind}, {stats['uri']})"),
        ("chunks", str(stats["chunks"])),
        ("documents", f"{stats['documents']} from {stats['knowledge_bases']} knowledge-base folder(s)"),
        ("categories", ", ".join(f"{name} {count}" for name, count in stats["categories"].items()) or "(none)"),
        ("vectors", f"{stats['dim']} dimensions, {stats['metric']}"),
        ("lexical", stats["lexical_mode"]),
        ("lookup plan", f"{plan} ({plan_reason})"),
        ("document vectors", f"{stats['document_vectors']} documents (title, summary, text)"),
        ("scoring profile", f"{stats['scoring_profile']} ({settings.scoring_profile or 'built in'})"),
        *((f"{feature} off", reason) for feature, reason in stats["features_off"].items()),
    ]
    width = max(len(label) for label, _ in rows)
    for label, value in rows:
        print(f"{label:<{width}}  {value}")
    return 0


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser], command: str | None) -> None:
    """The ``stats`` command's options."""
    p = sub.add_parser("stats", help="what the collection and the L0 index hold")
    add_location_arguments(p)
    p.add_argument("--json", action="store_true", help="print the figures as one JSON object (for scripts)")
    p.set_defaults(func=run)
