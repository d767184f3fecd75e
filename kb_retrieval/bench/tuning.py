"""The document ranking tuned honestly: per public golden set, today's weights against the ones each knowledge base
teaches itself, with the fits on golden sets cross-validated by query and left out by corpus.

For each corpus setting (the runbooks with their six sets, alone and mixed with a second corpus; the Prometheus
documentation with its two), in one run:

- ``configured``: the ``rank_*`` weights as set (``fit_ranking`` off), through the whole lookup;
- ``kb-fit``: the mixture the knowledge base chose on its own pseudo-queries (:mod:`kb_retrieval.retrieval.rank_fit`;
  no golden case is read to choose it), through the whole lookup;
- ``golden-cv``: the same three numbers (section weight, identity factor, lexical weight) chosen on the golden sets
  of every corpus at once, 5 folds by query (each case scored by a choice made without it, in any setting:
  :func:`fold_of`);
- ``golden-loco``: chosen on the golden sets of the settings that share no corpus with the held-out one
  (:func:`sharing_no_corpus`), scoring the held-out setting;
- ``rrf``: weight-free, reciprocal-rank fusion of the configured document ranking with retrieval's own order (the
  chunk-level hybrid ranking after the rule reranker).

The last three are replayed on each case's candidates and raw ranking signals (one lookup per case with every
weight 1), so they report hit@1 and hit@5 only; the first two report the right document in the context pack too.
A hit counts only when the lookup found something (as the bench counts it).

Run from the repository (states are ingested under ``--state-root`` when missing; a copy of an ingested state dir
saves the ingest)::

    python -m kb_retrieval.bench.tuning --state-root /tmp/tuning-states [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kb_retrieval.bench.quality import SETTINGS, Case, Setting, SystemScores, read_cases
from kb_retrieval.config import KBSettings
from kb_retrieval.retrieval.rank_fit import FOLDS, Point, PseudoCase, grid, mixture, order

SHARED = Path(__file__).resolve().parents[2].parent / "shared"
REPLAYED = ("golden-cv", "golden-loco", "rrf")
#: Reciprocal-rank fusion's constant (the stock QueryFusionRetriever's).
RRF_K = 60


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _open(setting: Setting, shared: Path, state_root: Path, *, fit: bool) -> Any:
    from kb_retrieval.engine import KnowledgeLookup
    from kb_retrieval.indexing.ingest import ingest

    settings = KBSettings(state_dir=state_root / setting.name, collection="kb_chunks")
    if not (settings.storage.state_dir / "milvus.db").exists():
        ingest([shared / "corpora" / c for c in setting.corpora], settings, progress=True)
    scoring = settings.scoring
    if scoring.fit_ranking != fit:  # a variant: its version says so in every trace
        scoring = scoring.variant("fit-on" if fit else "fit-off", fit_ranking=fit)
    return KnowledgeLookup(settings.updated(scoring=scoring))


def _measure(lookup: Any, cases: list[Case]) -> dict[str, Any]:
    from kb_retrieval.retrieval.query_check import EmptyQueryError

    scores = SystemScores()
    for case in cases:
        try:
            result, ranking = lookup.lookup_ranked(case.query)
        except EmptyQueryError:
            scores.add(case, [], False)
            scores.add_pack(case, [])
            continue
        found = result.found
        scores.add(case, [c.source for c in ranking] if found else [], found)
        scores.add_pack(case, result.context_pack.summary.included_sources if found else [])
    return _figures(scores)


def _figures(scores: SystemScores) -> dict[str, Any]:
    summary = scores.summary()
    return {k: summary.get(k) for k in ("hit@1", "hit@5", "right_doc_in_pack", "answerable")}


def _replay(cases: list[Case], captured: Sequence[PseudoCase | None], rank: Any) -> dict[str, Any]:
    scores = SystemScores()
    for case, cap in zip(cases, captured, strict=True):
        scores.add(case, rank(cap) if cap is not None else [], cap is not None)
    return _figures(scores)


def _rrf(cap: PseudoCase, weights: dict[str, float]) -> list[str]:
    ranked = order(cap.candidates, weights)
    given = [source for source, _ in cap.candidates]
    fused = {s: 1 / (RRF_K + 1 + ranked.index(s)) + 1 / (RRF_K + 1 + given.index(s)) for s in given}
    return sorted(given, key=lambda s: (-fused[s], given.index(s)))


def _hits_at_1(pool: list[tuple[Case, PseudoCase | None]], weights: dict[str, float]) -> float:
    return sum(
        1.0
        for case, cap in pool
        if cap is not None and case.relevant and (order(cap.candidates, weights)[:1] or [""])[0] in case.relevant
    )


def choose_on_golden(pool: list[tuple[Case, PseudoCase | None]], configured: dict[str, float]) -> Point:
    """The (section weight, identity factor, lexical weight) of the fit's grid with the most hits@1 on ``pool``
    (ties: the configured mixture, then the grid's order)."""
    points = grid(configured)
    best, best_hits = points[0], _hits_at_1(pool, configured)
    for point in points[1:]:
        hits = _hits_at_1(pool, mixture(configured, *point))
        if hits > best_hits:
            best, best_hits = point, hits
    return best


#: One golden case as replayed: (setting, set, position in the set, the case, its captured candidates).
Replayed = tuple[str, str, int, Case, PseudoCase | None]


def fold_of(position: int) -> int:
    """The cross-validation fold of the case at ``position`` in its set: the same case falls in the same fold in
    every setting that runs its set (the runbooks sets run in two), so no choice is made on a copy of the case it
    scores."""
    return position % FOLDS


def sharing_no_corpus(held_out: Setting, settings: Sequence[Setting]) -> list[str]:
    """The settings a choice left out by corpus may learn on: those that share no corpus with ``held_out`` (a
    setting that holds the held-out corpus among others would leak it)."""
    return [s.name for s in settings if not set(s.corpora) & set(held_out.corpora)]


def run(shared: Path, state_root: Path, names: Sequence[str]) -> dict[str, Any]:
    """Per public set and setting: the configured ranking vs the knowledge base's own fit, and the golden-set fits
    replayed. Rows are keyed ``setting/set`` (a set may run in several settings)."""
    from kb_retrieval.indexing.rank_teach import ranker_signals

    settings_by_name = {s.name: s for s in SETTINGS}
    report: dict[str, Any] = {"sets": {}, "fits": {}}
    pool: list[Replayed] = []
    configured: dict[str, float] = {}
    for name in names:
        setting = settings_by_name[name]
        today = _open(setting, shared, state_root, fit=False)
        configured = today.settings.scoring.ranking_weights()
        started = time.perf_counter()
        taught = _open(setting, shared, state_root, fit=True)
        fit = taught.state.rank_fit
        report["fits"][name] = {
            "describe": fit.describe() if fit else None,
            "section_weight": fit.section_weight if fit else None,
            "identity_scale": fit.identity_scale if fit else None,
            "lexical_weight": fit.weights.get("lexical") if fit else None,
            "cv_mrr_configured": fit.cv_mrr_configured if fit else None,
            "cv_mrr_fitted": fit.cv_mrr_fitted if fit else None,
            "open_s": round(time.perf_counter() - started, 1),
        }
        _log(f"[{name}] {report['fits'][name]}")
        for set_name in setting.golden_sets:
            cases = read_cases(shared / "golden" / f"{set_name}.jsonl")
            report["sets"][f"{name}/{set_name}"] = row = {
                "corpus": name,
                "set": set_name,
                "configured": _measure(today, cases),
                "kb-fit": _measure(taught, cases),
            }
            caps = ranker_signals(today, [c.query for c in cases])
            pool += [(name, set_name, i, c, p) for i, (c, p) in enumerate(zip(cases, caps, strict=True))]
            _log(f"[{name}] {set_name}: {row}")
        today.close()
        taught.close()
    # Fits on the golden sets, replayed on the captured candidates.
    folds = {
        fold: choose_on_golden([(c, p) for _, _, i, c, p in pool if fold_of(i) != fold], configured)
        for fold in range(FOLDS)
    }
    report["golden_cv_choices"] = [list(folds[f]) for f in range(FOLDS)]
    report["golden_loco_choices"] = {}
    for name in names:
        learn_on = set(sharing_no_corpus(settings_by_name[name], [settings_by_name[n] for n in names]))
        others = [(c, p) for n, _, _, c, p in pool if n in learn_on]
        loco = choose_on_golden(others, configured) if others else None
        report["golden_loco_choices"][name] = list(loco) if loco else None
        loco_weights = mixture(configured, *loco) if loco else None
        for set_name in settings_by_name[name].golden_sets:
            rows = [(i, c, p) for n, s, i, c, p in pool if n == name and s == set_name]
            cases, caps = [c for _, c, _ in rows], [p for _, _, p in rows]
            cv_ranked = [
                p and PseudoCase("", [(s, {}) for s in order(p.candidates, mixture(configured, *folds[fold_of(i)]))])
                for i, _, p in rows
            ]
            row = report["sets"][f"{name}/{set_name}"]
            row["golden-cv"] = _replay(cases, cv_ranked, lambda cap: [s for s, _ in cap.candidates])
            row["golden-loco"] = (
                _replay(cases, caps, lambda cap, w=loco_weights: order(cap.candidates, w)) if loco_weights else None
            )
            row["rrf"] = _replay(cases, caps, lambda cap: _rrf(cap, configured))
    return report


def table(report: dict[str, Any]) -> str:
    """The per-set table: hit@1 / hit@5 / right doc in pack for each system."""
    systems = ("configured", "kb-fit", *REPLAYED)
    lines = [
        "| set | setting | " + " | ".join(systems) + " |",
        "| --- | --- | " + " | ".join("---" for _ in systems) + " |",
    ]
    for row in report["sets"].values():
        cells = []
        for system in systems:
            m = row.get(system)
            if not m:
                cells.append("-")
                continue
            pack = m.get("right_doc_in_pack")
            cells.append(
                f"{m['hit@1']:.3f} / {m['hit@5']:.3f}"
                + (f" / {pack:.3f}" if system in ("configured", "kb-fit") and pack is not None else "")
            )
        lines.append(f"| {row['set']} | {row['corpus']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: run the tuning comparison and print its table."""
    parser = argparse.ArgumentParser(prog="python -m kb_retrieval.bench.tuning", description=__doc__.split("\n\n")[0])
    parser.add_argument("--shared", type=Path, default=SHARED, help="the shared folder (corpora, golden)")
    parser.add_argument("--state-root", type=Path, required=True, help="one state dir per corpus setting under it")
    parser.add_argument(
        "--settings", default=",".join(s.name for s in SETTINGS), help="corpus settings, comma-separated"
    )
    parser.add_argument("--json", type=Path, help="write the whole report here too")
    args = parser.parse_args(argv)
    report = run(args.shared, args.state_root, [n for n in args.settings.split(",") if n])
    if args.json:
        args.json.write_text(json.dumps(report, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(table(report))
    print()
    for name, fit in report["fits"].items():
        print(f"- {name}: {fit['describe']}")
    print(f"- golden-cv choices (section, identity, lexical) per fold: {report['golden_cv_choices']}")
    print(f"- golden-loco choices: {report['golden_loco_choices']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
