"""The identity check of a restructuring: every golden query's full result, timings removed, before and after.

A change that must not change behaviour (a refactor) is checked by running it twice: once on the code before, saving
the output, and once after, comparing. One run ingests the corpora of a setting into a state dir (a no-op when the
state dir already holds them), builds a ``KnowledgeLookup`` per variant (the default plan, and the Milvus plan through
each vector-store path) and writes, per golden set and variant, one file: a line per case (golden order) holding the
whole ``LookupResult`` JSON and the document ranking, keys sorted, with every clock field (``elapsed_ms``,
``stage_ms``, anything ending in ``_ms``) removed. Nothing else in a result depends on the clock or the machine's
state, so two runs on the same index are byte-identical when the code behaves the same.

    python -m kb_retrieval.bench.identity --setting runbooks --state /tmp/id-state --out /tmp/identity-before
    python -m kb_retrieval.bench.identity --setting runbooks --state /tmp/id-state --compare /tmp/identity-before

``--compare`` writes to a temporary folder and reports, per file, ``identical`` or the first case that differs (and
the first differing key path); it exits 1 when any file differs.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kb_retrieval.bench.quality import RUNBOOK_SETS

#: Corpus settings: the corpora ingested together, and the golden sets run against them.
SETTINGS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "runbooks": (("runbooks",), RUNBOOK_SETS),
    "mixed": (("runbooks", "awesome-alerts"), RUNBOOK_SETS),
    "prometheus-docs": (("prometheus-docs",), ("prometheus-docs-dev", "prometheus-docs-faq")),
}
#: The lookup variants each set runs through: settings overrides of the default (memory plan on Milvus Lite).
VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    "milvus-auto": {"lookup_plan": "milvus"},
    "milvus-sdk": {"lookup_plan": "milvus", "vector_store_mode": "sdk"},
    "milvus-vectorstore": {"lookup_plan": "milvus", "vector_store_mode": "vectorstore"},
}


def without_clocks(value: Any) -> Any:
    """``value`` (parsed JSON) without the fields a clock writes: ``elapsed_ms``, ``stage_ms``, any ``*_ms``."""
    if isinstance(value, dict):
        return {k: without_clocks(v) for k, v in value.items() if not k.endswith("_ms")}
    if isinstance(value, list):
        return [without_clocks(v) for v in value]
    return value


def case_lines(lookup: Any, cases: list[dict[str, Any]]) -> Iterator[str]:
    """One JSON line per case: its id, and the lookup's result and ranking (or the error it raised)."""
    for case in cases:
        record: dict[str, Any] = {"case_id": case["case_id"]}
        try:
            details = lookup.lookup_detailed(case.get("query") or "")
            record["result"] = without_clocks(json.loads(details.result.model_dump_json()))
            record["ranking"] = [without_clocks(json.loads(c.model_dump_json())) for c in details.ranking]
        except Exception as exc:  # an error is an outcome too (an empty query): it must be the same
            record["error"] = f"{type(exc).__name__}: {exc}"
        yield json.dumps(record, sort_keys=True, ensure_ascii=False)


def write_setting(setting: str, shared: Path, state: Path, out: Path, variants: list[str]) -> list[Path]:
    """Ingest the setting's corpora into ``state`` and write one file per (variant, golden set) into ``out``."""
    from kb_retrieval.config import KBSettings
    from kb_retrieval.engine import KnowledgeLookup
    from kb_retrieval.indexing.embeddings import load_embed_model
    from kb_retrieval.indexing.ingest import ingest

    corpora, sets = SETTINGS[setting]
    base = KBSettings(state_dir=state / setting, collection="kb_chunks")
    embed_model = load_embed_model()
    ingest([shared / "corpora" / c for c in corpora], base, embed_model=embed_model)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for variant in variants:
        lookup = KnowledgeLookup(base.updated(**VARIANTS[variant]))
        try:
            for name in sets:
                path = shared / "golden" / f"{name}.jsonl"
                cases = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
                target = out / f"{setting}.{variant}.{name}.jsonl"
                target.write_text("".join(f"{line}\n" for line in case_lines(lookup, cases)), encoding="utf-8")
                written.append(target)
        finally:
            lookup.close()
    return written


def first_difference(before: Path, after: Path) -> str | None:
    """``None`` when the two files are byte-identical, else the first differing case and key path."""
    if before.read_bytes() == after.read_bytes():
        return None
    old, new = before.read_text(encoding="utf-8").splitlines(), after.read_text(encoding="utf-8").splitlines()
    for number, (a, b) in enumerate(zip(old, new, strict=False), 1):
        if a != b:
            first, second = json.loads(a), json.loads(b)
            return f"line {number}, case {first.get('case_id')}: {_first_key(first, second, '')}"
    return f"{len(old)} lines before, {len(new)} after"


def _first_key(a: Any, b: Any, where: str) -> str:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            if a.get(key) != b.get(key):
                return _first_key(a.get(key), b.get(key), f"{where}.{key}")
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return f"{where}: {len(a)} items before, {len(b)} after"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            if x != y:
                return _first_key(x, y, f"{where}[{i}]")
    return f"{where}: {json.dumps(a)[:200]} -> {json.dumps(b)[:200]}"


def main(argv: list[str] | None = None) -> int:
    """The command: write the output of the settings asked for, or compare it with a saved one (exit 1 on a
    difference)."""
    parser = argparse.ArgumentParser(prog="python -m kb_retrieval.bench.identity", description=__doc__.split("\n")[0])
    parser.add_argument("--setting", action="append", choices=sorted(SETTINGS), required=True)
    parser.add_argument("--variant", action="append", choices=sorted(VARIANTS), help="default: all")
    parser.add_argument("--shared", type=Path, default=Path("../shared"), help="corpora/ and golden/ (../shared)")
    parser.add_argument("--state", type=Path, required=True, help="state dirs, one per setting (kept for reuse)")
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--out", type=Path, help="write the output here")
    target.add_argument("--compare", type=Path, help="compare with the output saved here")
    args = parser.parse_args(argv)
    variants = args.variant or list(VARIANTS)
    with tempfile.TemporaryDirectory() as scratch:
        out = args.out or Path(scratch)
        differing = 0
        for setting in args.setting:
            for path in write_setting(setting, args.shared, args.state, out, variants):
                if args.compare is None:
                    print(f"wrote {path.name}")
                    continue
                saved = args.compare / path.name
                why = first_difference(saved, path) if saved.is_file() else "no saved output"
                differing += why is not None
                print(f"{path.name}: {'identical' if why is None else 'DIFFERS: ' + why}")
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
