"""The ranking fit on real knowledge bases (Milvus Lite, the real models): taught on first load, stored per index
version, named in the document ranker's hit reason."""

from __future__ import annotations

from kb_retrieval.retrieval.rank_fit import load_fit


def test_the_runbooks_keep_the_configured_weights(runbooks_lookup) -> None:
    """On runbooks (one alert per document, template sections) the section does not beat the identity: measured
    (docs/tuning-history.md, session 19), so the fit keeps the weights as set."""
    fit = runbooks_lookup.state.rank_fit
    assert fit is not None and fit.queries == runbooks_lookup.settings.scoring.fit_queries
    assert not fit.fitted, fit.describe()
    assert load_fit(runbooks_lookup.settings.state_dir, runbooks_lookup.state.index_version) == fit
    ranker = runbooks_lookup.pipeline.postprocessors[2]
    assert ranker.weights == runbooks_lookup.settings.scoring.ranking_weights()
    assert ranker.mixture.startswith("as set (kept")


def test_the_hit_reason_names_the_mixture(runbooks_lookup) -> None:
    result = runbooks_lookup.lookup("etcd cluster has no leader")
    details = [r for b in result.evidence_blocks for r in b.hit_reasons if r.startswith("l1_document")]
    assert details and all("weights: as set (kept" in d for d in details)
