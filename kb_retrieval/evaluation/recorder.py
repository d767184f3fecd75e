"""``kb-retrieval fixtures record``: run the live pipeline once per golden case and freeze what it returned.

This is the only part of ``kb_retrieval.evaluation`` that needs the services (Milvus, the model); it imports them
inside the function, so the offline evaluator never does. Timings are left out of fixtures and scores are rounded
to 4 decimals, so re-recording an unchanged pipeline gives the same files.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from kb_retrieval.evaluation.fixtures import Fixture, FixtureCandidate, write_fixture
from kb_retrieval.evaluation.golden import load_golden

if TYPE_CHECKING:
    from kb_retrieval.config import KBSettings

SCORE_DIGITS = 4
_VOLATILE = {"elapsedMs", "stageMs", "traceRecorded"}


def record_fixtures(
    golden_path: Path, out_dir: Path, settings: KBSettings, lookup: Any = None, *, progress: bool = False
) -> int:
    """Write one fixture per golden case into ``out_dir``; returns the number written. ``progress``: a bar of
    cases on stderr when it is a terminal."""
    from kb_retrieval.engine import KnowledgeLookup
    from kb_retrieval.progress import progress_bar

    cases = load_golden(golden_path)
    lookup = lookup or KnowledgeLookup(settings)
    out_dir.mkdir(parents=True, exist_ok=True)
    recorder = {
        "collection": settings.storage.collection,
        "metric": settings.schema_fields.metric,
        "vector_store_mode": settings.retrieval.vector_store_mode,
        "query_encoder": settings.embedding.query_encoder,
        "top_k": settings.retrieval.top_k,
        "max_evidence_blocks": settings.evidence.max_evidence_blocks,
        "evidence_threshold": settings.evidence.evidence_threshold,
        "evidence_follows_ranking": settings.evidence.evidence_follows_ranking,
        "evidence_fills_by_ranking": settings.evidence.evidence_fills_by_ranking,
        "reference_threshold": settings.evidence.reference_threshold,
    }
    bar = progress_bar(len(cases), "recording fixtures", "case", enabled=progress)
    for case in cases:
        result, ranking = lookup.lookup_ranked(case.query)
        candidates = [
            FixtureCandidate(
                rank=rank,
                source=c.source,
                title=c.title,
                breadcrumb=c.breadcrumb,
                category=c.category,
                score_label=c.score_label.value,
                score=round(c.score, SCORE_DIGITS),
                similarity=round(c.similarity, SCORE_DIGITS),
                path=c.path,
                content=c.content,
            )
            for rank, c in enumerate(ranking, start=1)
        ]
        write_fixture(
            Fixture(
                case_id=case.case_id,
                query=case.query,
                recorder=recorder,
                candidates=candidates,
                result=_stable(result.to_json_dict()),
            ),
            out_dir,
        )
        bar.update()
    bar.close()
    return len(cases)


def _stable(value: Any) -> Any:
    """Drop timings; round floats so the file does not change with noise in the last digits."""
    if isinstance(value, dict):
        return {k: _stable(v) for k, v in value.items() if k not in _VOLATILE}
    if isinstance(value, list):
        return [_stable(v) for v in value]
    if isinstance(value, float):
        return round(value, SCORE_DIGITS)
    return value
