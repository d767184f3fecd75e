"""Document-level retrieval quality of ``lookup_knowledge`` and the stock retrievers on the shared golden sets.

For ``lookup_knowledge`` the ranking is the document-level ranking the tool answered from when it reported
``found = true``, and empty when it reported no evidence (an answer withheld counts as a miss). The stock retrievers
always return something, so on cases without an expected document they are never right.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kb_retrieval.bench.stock import build_stock, document_ranking
from kb_retrieval.config import KBSettings
from kb_retrieval.progress import progress_bar

KS = (1, 3, 5)
#: Relevance levels in the calibration table's order.
LEVELS = ("high", "medium", "low", "none")


@dataclass(frozen=True)
class Setting:
    """A corpus configuration: the KB folders ingested together, and the golden sets run against them."""

    name: str
    corpora: tuple[str, ...]
    golden_sets: tuple[str, ...]


RUNBOOK_SETS = (
    "runbooks-alerts-dev",
    "runbooks-alerts-dev-named",
    "runbooks-alerts-instances",
    "runbooks-alerts-etcd",
    "runbooks-alerts-unmapped",
    "runbooks-paraphrase-dev",
)
SETTINGS = (
    Setting("runbooks", ("runbooks",), RUNBOOK_SETS),
    Setting("mixed", ("runbooks", "awesome-alerts"), RUNBOOK_SETS),
    Setting("prometheus-docs", ("prometheus-docs",), ("prometheus-docs-dev", "prometheus-docs-faq")),
)


@dataclass
class Case:
    """One golden case as the quality bench reads it: the query, the documents answering it, what its evidence holds."""

    case_id: str
    query: str
    relevant: set[str]
    keywords: list[str] = field(default_factory=list)
    breadcrumbs: list[str] = field(default_factory=list)

    @property
    def judged_strong(self) -> bool:
        """An answerable case that names what its evidence must hold (keywords or breadcrumbs)."""
        return bool(self.relevant and (self.keywords or self.breadcrumbs))

    def strong(self, evidence_text: str) -> bool:
        """Spec 002's strong, judged on the text the agent received for the expected document."""
        text = evidence_text.casefold()
        return all(k.casefold() in text for k in self.keywords) and all(b.casefold() in text for b in self.breadcrumbs)


def read_cases(path: Path) -> list[Case]:
    """Golden lines as they are (a blank query is kept: the right answer to it is no evidence)."""
    cases = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            record = json.loads(line)
            relevant = set(record.get("expected_docs") or []) | set(record.get("acceptable_docs") or [])
            cases.append(
                Case(
                    record["case_id"],
                    record.get("query") or "",
                    relevant,
                    list(record.get("expected_keywords") or []),
                    [_heading(b) for b in record.get("expected_breadcrumbs") or []],
                )
            )
    return cases


def _heading(breadcrumb: object) -> str:
    """An expected breadcrumb as text: a string, or the ``heading`` of a ``{doc, anchor, heading}`` object."""
    return str(breadcrumb.get("heading") or "") if isinstance(breadcrumb, dict) else str(breadcrumb)


@dataclass
class SystemScores:
    """The counts one system gathers over a golden set, from which its quality figures are computed."""

    answerable: int = 0
    hits: dict[int, int] = field(default_factory=lambda: dict.fromkeys(KS, 0))
    reciprocal_ranks: float = 0.0
    no_answer: int = 0
    no_answer_correct: int = 0
    answerable_found: int = 0
    strong_judged: int = 0
    strong: int = 0
    filter_excluded: int = 0
    in_pack: int = 0
    pack_judged: int = 0
    levels: dict[str, list[int]] = field(default_factory=dict)

    def add_filter(self, case: Case, category: str | None, category_of: Callable[[str], str | None]) -> None:
        """Counts an answerable case whose L0 category filter excluded every expected document."""
        if category and case.relevant and all(category_of(source) != category for source in case.relevant):
            self.filter_excluded += 1

    def add_strong(self, case: Case, top_source: str | None, evidence_text: str) -> None:
        """Strong@1: the first document is right and its packed evidence holds every expected keyword/breadcrumb."""
        if case.judged_strong:
            self.strong_judged += 1
            self.strong += int(top_source in case.relevant and case.strong(evidence_text))

    def add_pack(self, case: Case, packed_sources: list[str]) -> None:
        """Right document in the pack: an expected document is among those the agent's context pack holds."""
        if case.relevant:
            self.pack_judged += 1
            self.in_pack += int(any(source in case.relevant for source in packed_sources))

    def add_level(self, case: Case, level: str, top_source: str | None) -> None:
        """The calibration table: per relevance level, the lookups at it and how many were right (found, and the
        first document is a relevant one; a found answer to an unanswerable case is wrong)."""
        counts = self.levels.setdefault(level, [0, 0])
        counts[0] += 1
        counts[1] += int(top_source is not None and top_source in case.relevant)

    def add(self, case: Case, ranking: list[str], found: bool) -> None:
        if not case.relevant:
            self.no_answer += 1
            self.no_answer_correct += int(not found)
            return
        self.answerable += 1
        self.answerable_found += int(found)
        rank = next((i for i, source in enumerate(ranking[:10], start=1) if source in case.relevant), None)
        if rank is not None:
            self.reciprocal_ranks += 1.0 / rank
            for k in KS:
                self.hits[k] += int(rank <= k)

    def summary(self) -> dict[str, Any]:
        n = self.answerable
        out: dict[str, Any] = {"answerable": n, "no_answer": self.no_answer}
        for k in KS:
            out[f"hit@{k}"] = round(self.hits[k] / n, 4) if n else None
        out["mrr@10"] = round(self.reciprocal_ranks / n, 4) if n else None
        out["no_answer_found_false"] = round(self.no_answer_correct / self.no_answer, 4) if self.no_answer else None
        out["answerable_found_true"] = round(self.answerable_found / n, 4) if n else None
        out["strong@1"] = round(self.strong / self.strong_judged, 4) if self.strong_judged else None
        out["strong_judged"] = self.strong_judged
        out["filter_excluded_all_expected"] = self.filter_excluded
        if self.pack_judged:
            out["right_doc_in_pack"] = round(self.in_pack / self.pack_judged, 4)
        if self.levels:
            out["relevance_calibration"] = {
                level: {"lookups": n, "right": right, "precision": round(right / n, 4) if n else None}
                for level, (n, right) in sorted(self.levels.items(), key=lambda item: LEVELS.index(item[0]))
            }
        return out


def run_setting(
    setting: Setting, shared: Path, state_root: Path, embed_model: Any, log: Callable[[str], None]
) -> dict[str, dict[str, dict[str, Any]]]:
    """{golden set: {system: metrics}} for one setting."""
    from kb_retrieval.engine import KnowledgeLookup
    from kb_retrieval.indexing.ingest import ingest
    from kb_retrieval.retrieval.query_transform import EmptyQueryError

    roots = [shared / "corpora" / c for c in setting.corpora]
    # The default settings (on Milvus Lite: the memory plan), as a user has them.
    settings = KBSettings(state_dir=state_root / setting.name, collection="kb_chunks")
    summary = ingest(roots, settings, embed_model=embed_model, progress=True)
    log(f"[{setting.name}] lookup_knowledge index: {summary.documents} documents, embedded {summary.chunks_embedded}")
    lookup = KnowledgeLookup(settings)  # queries embedded as a user's are (ONNX)
    stock = build_stock(roots, settings.resolved_milvus_uri(), "stock_chunks", embed_model)
    log(f"[{setting.name}] stock index: {stock.chunk_count} chunks")

    over, chunks = chunks_over_model_max(lookup.client, settings)
    log(f"[{setting.name}] chunks over the embedding model's maximum word pieces: {over} of {chunks}")
    documents = lookup.l0.index.documents

    def category_of(source: str) -> str | None:
        entry = documents.get(source)
        return entry.category if entry else None

    results: dict[str, dict[str, dict[str, Any]]] = {}
    calibration: dict[str, Any] | None = None
    for set_name in setting.golden_sets:
        cases = read_cases(shared / "golden" / f"{set_name}.jsonl")
        scores = {"lookup_knowledge": SystemScores(), **{name: SystemScores() for name in stock.by_name()}}
        bar = progress_bar(len(cases), f"[{setting.name}] {set_name}", "case")
        for case in cases:
            try:
                result, ranking = lookup.lookup_ranked(case.query)
                found = result.found
                scores["lookup_knowledge"].add(case, [c.source for c in ranking] if found else [], found)
                top = result.context_pack.blocks[0] if found and result.context_pack.blocks else None
                packed = f"{top.breadcrumb or ''}\n{top.content}" if top else ""
                scores["lookup_knowledge"].add_strong(case, top.source if top else None, packed)
                scores["lookup_knowledge"].add_pack(case, result.context_pack.summary.included_sources if found else [])
                scores["lookup_knowledge"].add_filter(case, result.query_transform.category_filter, category_of)
                first = result.evidence_blocks[0].source if found and result.evidence_blocks else None
                scores["lookup_knowledge"].add_level(case, result.relevance_level, first)
                calibration = result.retrieval_trace.calibration or calibration
            except EmptyQueryError:
                scores["lookup_knowledge"].add(case, [], False)
                scores["lookup_knowledge"].add_pack(case, [])
                scores["lookup_knowledge"].add_level(case, "none", None)
            for name, retriever in stock.by_name().items():
                stock_ranking = document_ranking(retriever, case.query) if case.query.strip() else []
                scores[name].add(case, stock_ranking, bool(stock_ranking))
            bar.update()
        bar.close()
        results[set_name] = {name: s.summary() for name, s in scores.items()}
        results[set_name]["lookup_knowledge"]["chunks_over_model_max"] = over
        if calibration is not None:
            results[set_name]["lookup_knowledge"]["calibration"] = calibration
        if any(not c.relevant for c in cases) and any(c.relevant for c in cases):
            results[set_name]["lookup_knowledge"]["found_curve"] = found_curve(lookup, cases)
        log(
            f"[{setting.name}] {set_name}: "
            + ", ".join(f"{n} hit@1={m['hit@1']}" for n, m in results[set_name].items())
        )
    lookup.close()
    return results


def chunks_over_model_max(client: Any, settings: KBSettings) -> tuple[int, int]:
    """(chunks whose embedded text is longer than the embedding model's maximum word pieces, chunks) in the
    collection, counted with the model's own tokenizer on the text each chunk was embedded from."""
    from kb_retrieval.indexing.embeddings import word_piece_limit
    from kb_retrieval.indexing.milvus import iter_rows
    from kb_retrieval.knowledge.chunker import BREADCRUMB_SEPARATOR, embedding_text

    limit = word_piece_limit(settings.embedding.embed_model)
    over = total = 0
    for row in iter_rows(
        client, settings, [settings.schema_fields.content_field, settings.schema_fields.metadata_field]
    ):
        meta = row.get(settings.schema_fields.metadata_field) or {}
        crumb = str(meta.get("breadcrumb") or "").split(BREADCRUMB_SEPARATOR)
        text = embedding_text(str(meta.get("title") or ""), crumb, row.get(settings.schema_fields.content_field, ""))
        total += 1
        over += int(limit is not None and not limit.fits(text))
    return over, total


#: evidence_threshold values the found trade-off is measured at (the default, 0.42, among them).
CURVE_THRESHOLDS = (0.30, 0.34, 0.38, 0.42, 0.46, 0.50, 0.54)


def found_curve(lookup: Any, cases: list[Case]) -> list[dict[str, float]]:
    """The found decision's trade-off on one golden set: at each ``evidence_threshold`` of
    :data:`CURVE_THRESHOLDS`, the share of answerable cases with found=true and of unanswerable ones with
    found=false, every case looked up again with that threshold (the retry decision follows it, as in a lookup),
    the knowledge base's calibration off (it would raise the lower thresholds to its own)."""
    from kb_retrieval.retrieval.query_transform import EmptyQueryError

    curve = []
    for threshold in CURVE_THRESHOLDS:
        at = lookup.with_settings(evidence_threshold=threshold, calibrate_thresholds=False)
        scores = SystemScores()
        for case in cases:
            try:
                scores.add(case, [], at.lookup(case.query).found)
            except EmptyQueryError:
                scores.add(case, [], False)
        summary = scores.summary()
        curve.append(
            {
                "evidence_threshold": threshold,
                "answerable_found_true": summary["answerable_found_true"],
                "no_answer_found_false": summary["no_answer_found_false"],
            }
        )
    return curve
