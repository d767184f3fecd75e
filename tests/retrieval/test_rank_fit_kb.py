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
    assert load_fit(runbooks_lookup.settings.storage.state_dir, runbooks_lookup.state.index_version) == fit
    ranker = runbooks_lookup.pipeline.postprocessors[2]
    assert ranker.weights == runbooks_lookup.settings.scoring.ranking_weights()
    assert ranker.mixture.startswith("as set (kept")


def test_the_hit_reason_names_the_mixture(runbooks_lookup) -> None:
    result = runbooks_lookup.lookup("etcd cluster has no leader")
    # Each document's similarities name the mixture (a document placed by content says so in a reason of its own).
    details = [r for b in result.evidence_blocks for r in b.hit_reasons if r.startswith("l1_document:title")]
    assert details and all("weights: as set (kept" in d for d in details)


def test_a_fitted_lexical_weight_reaches_the_ranker_and_its_hit_reason(tmp_path, embed_model) -> None:
    """A small written KB (too small to teach: the configured weights are stored on its first open); a fit that chose
    the best section's BM25 at 16, stored for its index version, is what the next lookup ranks with and names."""
    from kb_retrieval.engine import KnowledgeLookup
    from kb_retrieval.retrieval.rank_fit import RankFit, mixture, store_fit
    from tests.support.kb import ingested, write_kb

    kb = write_kb(
        tmp_path / "kb",
        {
            "storage/retention.md": "# Retention\n\n## Time limit\n\nBlocks older than the retention time are deleted "
            "by compaction.\n",
            "storage/compaction.md": "# Compaction\n\n## Levels\n\nSmall blocks are merged into larger ones in the "
            "background.\n",
        },
    )
    settings = ingested([kb], tmp_path / "state", embed_model, vector_store_mode="sdk")
    first = KnowledgeLookup(settings)
    version, kept = first.state.index_version, first.state.rank_fit
    first.close()
    assert kept is not None and not kept.fitted and "fewer than" in kept.reason
    configured = settings.scoring.ranking_weights()
    weights = mixture(configured, 0.0, 0.0, 16.0)
    store_fit(
        settings.storage.state_dir,
        RankFit(
            version,
            weights,
            0.0,
            0.0,
            60,
            "fitted on 60 pseudo-queries",
            lexical_weight=16.0,
            taught_under=settings.scoring.fit_inputs(),
        ),
    )
    lookup = KnowledgeLookup(settings)
    try:
        ranker = lookup.pipeline.postprocessors[2]
        assert ranker.weights == weights and ranker.weights["lexical"] == 16.0 != configured["lexical"]
        result = lookup.lookup("when are old blocks deleted by compaction")
        details = [r for b in result.evidence_blocks for r in b.hit_reasons if r.startswith("l1_document:title")]
        assert details and all("lexical 16 (fitted on 60" in d for d in details)
        # A variant with other ranking weights shares the lookup's state, fit included, but not the fit's choice:
        # it ranks with its own weights as written and says why.
        variant = lookup.with_settings(scoring=settings.scoring.variant("title", rank_title=2.0))
        assert variant.rank_fit == lookup.rank_fit
        assert variant.pipeline.postprocessors[2].weights == variant.settings.scoring.ranking_weights()
        result = variant.lookup("when are old blocks deleted by compaction")
        details = [r for b in result.evidence_blocks for r in b.hit_reasons if r.startswith("l1_document:title")]
        assert details and all("fit was taught under other ranking weights" in d for d in details)
    finally:
        lookup.close()

    # Another scoring profile (another sample size) does not rank with that fit: it teaches the version again (too
    # small a KB: the configured weights, kept), and stores what it was taught under.
    other = settings.updated(scoring=settings.scoring.variant("more-queries", fit_queries=300))
    lookup = KnowledgeLookup(other)
    try:
        fit = lookup.state.rank_fit
        assert fit is not None and not fit.fitted and "fewer than" in fit.reason
        assert fit.taught_under == other.scoring.fit_inputs() != settings.scoring.fit_inputs()
        assert lookup.pipeline.postprocessors[2].weights == configured
        assert load_fit(settings.storage.state_dir, version, other.scoring.fit_inputs()) == fit
    finally:
        lookup.close()


def test_a_version_a_reload_publishes_is_taught_beside_the_lookups(tmp_path, embed_model) -> None:
    """A running lookup that reloads a new version without a stored fit teaches it on a thread of its own and
    publishes the state again with it: the lookups after it rank with the new version's fit, stored for it."""
    import shutil
    import time

    from kb_retrieval.engine import KnowledgeLookup
    from kb_retrieval.indexing.ingest import ingest
    from tests.conftest import SAMPLE_KB
    from tests.support.kb import ingested

    kb = tmp_path / "kb"
    shutil.copytree(SAMPLE_KB / "redis", kb / "redis")
    # Few pseudo-queries suffice here, so that the fit is taught by lookups (not kept for too few).
    settings = ingested([kb], tmp_path / "state", embed_model, freshness_check_s=3600)
    settings = settings.updated(scoring=settings.scoring.variant("few-queries", fit_min_queries=5))
    lookup = KnowledgeLookup(settings, embed_model=embed_model)
    try:
        first = lookup.state.rank_fit
        assert first is not None and "fewer than" not in first.reason
        shutil.copytree(SAMPLE_KB / "mysql", kb / "mysql")
        ingest([kb], settings, embed_model=embed_model)
        assert lookup.refresh(force=True)
        version = lookup.state.index_version
        assert version != first.index_version
        assert lookup.lookup("mysql replication lag").found  # a lookup goes on while the version is taught
        waited = time.monotonic()
        while lookup.state.rank_fit is None and time.monotonic() - waited < 300:
            time.sleep(0.2)
        fit = lookup.state.rank_fit
        assert fit is not None and fit.index_version == version and "fewer than" not in fit.reason
        assert load_fit(settings.storage.state_dir, version) == fit
        assert lookup.pipeline.postprocessors[2].weights == fit.weights
    finally:
        lookup.close()


def test_the_memory_plan_teaches_from_the_mirrors_rows_without_a_second_scan(runbooks_lookup, embed_model) -> None:
    """On the memory plan the fit's pseudo-queries come from the rows the mirror holds (a scan of a 100k-chunk
    collection on Milvus Lite took ~25 s): the same section rows and queries as a scan of the collection, and
    teaching reads no row from Milvus."""
    import pytest

    from kb_retrieval.engine import KnowledgeLookup
    from kb_retrieval.indexing import milvus, rank_teach
    from kb_retrieval.indexing.pseudo_queries import pseudo_queries

    source = runbooks_lookup
    settings = source.settings.model_copy(update={"lookup_plan": "memory"})
    lookup = KnowledgeLookup(settings, embed_model=embed_model, client=source.client, trace_store=source.traces)
    try:
        assert lookup.plan == "memory" and lookup.state.memory is not None
        scanned = rank_teach.section_rows(lookup.client, settings)
        mirrored = rank_teach.section_rows(lookup.client, settings, lookup.state.memory.rows)
        assert sorted(mirrored, key=lambda r: r.chunk_id) == sorted(scanned, key=lambda r: r.chunk_id)
        limit = settings.scoring.fit_queries
        assert pseudo_queries(mirrored, limit=limit) == pseudo_queries(scanned, limit=limit)
        stored = []

        def no_scan(*args, **kwargs):
            raise AssertionError("teaching on the memory plan scanned the collection")

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(milvus, "iter_rows", no_scan)
            patch.setattr(rank_teach, "store_fit", lambda state_dir, fit: stored.append(fit))
            fit = rank_teach._teach(lookup, lookup.state.index_version, settings.scoring.fit_inputs(), None)
        assert fit is not None and stored == [fit] and fit.queries == limit
    finally:
        lookup.close()
