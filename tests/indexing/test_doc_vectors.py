"""Document vectors (title, summary, whole text, and the static model's summary) in the companion collection
``<collection>_docs``, on Milvus Lite with the real models: what each vector is embedded from, convergent writes,
reading them back, an older layout."""

from __future__ import annotations

import numpy as np
import pytest
from pymilvus import DataType

from kb_retrieval.config import KBSettings
from kb_retrieval.indexing.doc_vectors import (
    TERMS_MAX_BYTES,
    VECTORS_FIELD,
    DocumentVectors,
    doc_vectors_collection_name,
    doc_vectors_off_reason,
    document_terms,
    document_texts,
    embed_doc_texts,
    opening_words,
    plan_doc_vectors,
    readable_title,
    write_planned_doc_vectors,
)
from kb_retrieval.indexing.embeddings import embed_query, embed_texts, normalise
from kb_retrieval.indexing.ingest import ingest
from kb_retrieval.indexing.milvus import connect, ensure_collection, ensure_side_collection, iter_rows
from kb_retrieval.indexing.static_embed import STATIC_DIM, load_static_embedder
from kb_retrieval.knowledge.loader import load_knowledge_base
from tests.indexing.test_ingest import DOC_A, DOC_B, write_kb

RUNBOOK = """---
title: KubeQuotaAlmostFull
---
# KubeQuotaAlmostFull

## Meaning

Cluster reaches to the allowed limits for given namespace.

## Impact

In the future deployments may not be possible.

```yaml
# not a heading
```
"""


@pytest.fixture
def settings(tmp_path) -> KBSettings:
    return KBSettings(state_dir=tmp_path / "a")


def test_camel_case_titles_become_words():
    assert readable_title("KubeQuotaAlmostFull") == "Kube Quota Almost Full"
    assert readable_title("etcdGRPCRequestsSlow") == "Etcd GRPC Requests Slow"
    assert readable_title("Redis memory usage high") == "Redis memory usage high"
    assert (
        readable_title("APC UPS alert rules (mdlayher/apcupsd_exporter)")
        == "APC UPS alert rules (mdlayher/apcupsd_exporter)"
    )


def test_summary_is_the_title_and_the_opening_section_only(tmp_path):
    body = RUNBOOK.split("---\n", 2)[2]
    assert opening_words(body) == "Cluster reaches to the allowed limits for given namespace."
    assert opening_words("# T\n\n```\ncode line\n```\n\none two three four", limit=3) == "one two three"
    kb = write_kb(tmp_path / "kb", {"kubernetes/KubeQuotaAlmostFull.md": RUNBOOK})
    doc = load_knowledge_base(kb).documents[0]
    assert document_texts(doc) == (
        "Kube Quota Almost Full",
        "Kube Quota Almost Full: Cluster reaches to the allowed limits for given namespace.",
    )


def test_a_document_s_terms_are_its_distinct_words_as_far_as_the_field_holds(tmp_path):
    words = [f"word{i:05d}" for i in range(9000)]  # ~90 KB of distinct words
    body = "# Big\n\n" + " ".join(words + words[:10])
    kb = write_kb(tmp_path / "kb", {"big.md": "---\ntitle: Big page\n---\n" + body})
    terms = document_terms(load_knowledge_base(kb).documents[0])
    assert len(terms.encode()) <= TERMS_MAX_BYTES
    kept = terms.split()
    assert kept == ["big", "page", *words[: len(kept) - 2]]  # whole words, in order of first use, none twice
    assert len(kept) > 5000


def doc_rows(settings: KBSettings) -> dict[str, dict]:
    client = connect(settings)
    name = doc_vectors_collection_name(settings)
    client.load_collection(name)
    fields = ["source", "kb", "row_hash", "title", "terms", "doc_vectors"]
    return {r["source"]: r for r in iter_rows(client, settings, fields, collection=name)}


def test_ingest_writes_four_vectors_per_document_and_nothing_twice(tmp_path, settings, embed_model):
    a = write_kb(tmp_path / "a", {"redis/memory.md": DOC_A, "mysql/lag.md": DOC_B})
    b = write_kb(tmp_path / "b", {"kubernetes/KubeQuotaAlmostFull.md": RUNBOOK})
    ingest([a], settings, embed_model=embed_model)
    ingest([b], settings, embed_model=embed_model)
    rows = doc_rows(settings)
    assert set(rows) == {"redis/memory.md", "mysql/lag.md", "kubernetes/KubeQuotaAlmostFull.md"}
    doc = next(d for d in load_knowledge_base(a).documents if d.source_id == "redis/memory.md")
    stored = np.asarray(rows["redis/memory.md"]["doc_vectors"], dtype=np.float32)
    assert stored.shape == (3 * settings.schema_fields.dim + STATIC_DIM,)
    got = stored[: 3 * settings.schema_fields.dim].reshape(3, -1)  # title|summary|text, then the static summary
    assert np.allclose(got[:2], embed_texts(embed_model, list(document_texts(doc))), atol=1e-5)
    static = load_static_embedder().embed([document_texts(doc)[1]])[0]
    assert np.allclose(stored[3 * settings.schema_fields.dim :], static, atol=1e-6)
    quota = rows["kubernetes/KubeQuotaAlmostFull.md"]
    assert quota["title"] == "Kube Quota Almost Full"  # what the weighted title similarity reads
    terms = quota["terms"].split()
    assert terms[:5] == ["kube", "quota", "almost", "full", "kubequotaalmostfull"] and len(terms) == len(set(terms))
    assert {"cluster", "namespace", "deployments", "yaml"} <= set(terms)
    chunks = [
        r for r in iter_rows(connect(settings), settings, ["source", "vector"]) if r["source"] == "redis/memory.md"
    ]
    assert len(chunks) >= 2  # the text vector is the mean of the document's chunk vectors
    assert np.allclose(got[2], normalise([np.mean([r["vector"] for r in chunks], axis=0)])[0], atol=1e-5)
    # Converged: nothing to embed or write again.
    kbs = [load_knowledge_base(a), load_knowledge_base(b)]
    ids = chunk_ids(settings)
    plan = plan_doc_vectors(connect(settings), settings, kbs, ids)
    assert plan.todo == [] and plan.deletes == []
    # Other chunks (another chunk size) make another text vector: the row is rewritten.
    changed = {**ids, "mysql/lag.md": [*ids["mysql/lag.md"], "another-chunk"]}
    plan = plan_doc_vectors(connect(settings), settings, kbs, changed)
    lag = next(d for d in kbs[0].documents if d.source_id == "mysql/lag.md")
    assert [(p.doc.source_id, p.texts) for p in plan.todo] == [("mysql/lag.md", document_texts(lag))]
    embedded = embed_doc_texts(plan, embed_model, settings.embedding.embed_batch_size)
    assert write_planned_doc_vectors(connect(settings), settings, plan, embedded) == 1
    assert doc_rows(settings)["mysql/lag.md"]["row_hash"] == plan.todo[0].row_hash
    # An edit re-embeds that document only; a removal deletes only its folder's row.
    (a / "redis/memory.md").write_text(DOC_A.replace("Raise maxmemory", "Lower the TTLs"), encoding="utf-8")
    (a / "mysql/lag.md").unlink()
    before = rows
    ingest([a], settings, embed_model=embed_model)
    after = doc_rows(settings)
    assert set(after) == {"redis/memory.md", "kubernetes/KubeQuotaAlmostFull.md"}
    assert after["redis/memory.md"]["row_hash"] != before["redis/memory.md"]["row_hash"]
    assert after["kubernetes/KubeQuotaAlmostFull.md"] == before["kubernetes/KubeQuotaAlmostFull.md"]


def chunk_ids(settings: KBSettings) -> dict[str, list[str]]:
    ids: dict[str, list[str]] = {}
    for row in iter_rows(
        connect(settings), settings, [settings.schema_fields.id_field, settings.schema_fields.source_field]
    ):
        ids.setdefault(row[settings.schema_fields.source_field], []).append(row[settings.schema_fields.id_field])
    return ids


def test_vectors_read_back_rank_the_right_title(tmp_path, settings, embed_model):
    kb = write_kb(tmp_path / "kb", {"redis/memory.md": DOC_A, "kubernetes/KubeQuotaAlmostFull.md": RUNBOOK})
    ingest([kb], settings, embed_model=embed_model)
    other = KBSettings(state_dir=tmp_path / "b", milvus_uri=settings.resolved_milvus_uri())  # any host reads them
    vectors = DocumentVectors.load_from_milvus(connect(other), other)
    assert vectors.enabled and len(vectors) == 2
    query = embed_query(embed_model, "our namespace quota is nearly used up")
    text = "our namespace quota is nearly used up"
    sims = vectors.similarities(query, ["redis/memory.md", "kubernetes/KubeQuotaAlmostFull.md", "unknown.md"], text)
    assert set(sims) == {"redis/memory.md", "kubernetes/KubeQuotaAlmostFull.md"}
    assert all(-1.0 <= s <= 1.0 for four in sims.values() for s in four)
    assert all(q > r for q, r in zip(sims["kubernetes/KubeQuotaAlmostFull.md"], sims["redis/memory.md"], strict=True))


def test_collection_without_companion_has_document_vectors_off(settings):
    client = connect(settings)
    ensure_collection(client, settings)  # as another tool would leave it: chunks only
    vectors = DocumentVectors.load_from_milvus(client, settings)
    assert not vectors.enabled and len(vectors) == 0
    assert f"'{doc_vectors_collection_name(settings)}'" in (vectors.off_reason or "")
    assert vectors.similarities([0.1] * settings.schema_fields.dim, ["x.md"]) == {}


def _version_3_fields(schema) -> None:
    """The companion's scalar fields before titles and terms were kept."""
    for name, length in (("source", 1024), ("kb", 4096), ("row_hash", 64)):
        schema.add_field(name, DataType.VARCHAR, max_length=length, is_primary=name == "source")


@pytest.mark.parametrize(
    "layout",
    [
        pytest.param((_version_3_fields, 3), id="before-the-static-vector"),
        pytest.param((_version_3_fields, None), id="before-titles-and-terms"),
    ],
)
def test_a_companion_of_an_older_layout_is_off_until_ingest_rewrites_it(tmp_path, settings, embed_model, layout):
    fields, kinds = layout
    client = connect(settings)
    ensure_collection(client, settings)
    name = doc_vectors_collection_name(settings)
    dim = kinds * settings.schema_fields.dim if kinds else 3 * settings.schema_fields.dim + STATIC_DIM
    ensure_side_collection(client, settings, name, fields, vector_field=VECTORS_FIELD, vector_dim=dim)
    client.insert(name, [{"source": "x.md", "kb": "k", "row_hash": "old", VECTORS_FIELD: [0.1] * dim}])
    reason = doc_vectors_off_reason(client, settings) or ""
    if kinds:  # title|summary|text only
        assert (
            f"holds vectors of {dim} values, not {3 * settings.schema_fields.dim + STATIC_DIM}: an older layout"
            in reason
        )
    else:
        assert f"collection '{name}' lacks fields terms, title: an older layout" in reason
    assert not DocumentVectors.load_from_milvus(client, settings).enabled
    kb = write_kb(tmp_path / "kb", {"redis/memory.md": DOC_A})
    ingest([kb], settings, embed_model=embed_model)
    assert doc_vectors_off_reason(client, settings) is None
    vectors = DocumentVectors.load_from_milvus(client, settings)
    assert vectors.enabled and vectors.sources == ["redis/memory.md"]  # the old rows went with the old layout


def test_titles_and_terms_read_back_weigh_a_word_every_document_shares_least(tmp_path, settings, embed_model):
    pages = {
        "start.md": ("Getting started with Acme", "Install Acme, run Acme and point Acme at its first targets."),
        "compare.md": ("Comparison to alternatives", "How Acme differs from Graphite and InfluxDB in storage."),
        "push.md": ("Pushing metrics", "Acme pulls; short-lived batch jobs push to a gateway instead."),
    }
    docs = {name: f"---\ntitle: {title}\n---\n# {title}\n\n{text}\n" for name, (title, text) in pages.items()}
    ingest([write_kb(tmp_path / "kb", docs)], settings, embed_model=embed_model)
    other = KBSettings(state_dir=tmp_path / "b", milvus_uri=settings.resolved_milvus_uri())
    vectors = DocumentVectors.load_from_milvus(connect(other), other)
    weights = vectors.term_weights
    assert weights is not None and weights.documents == 3
    assert weights("acme") < weights("graphite") < weights("never-used")
    question = "How does Acme compare with other tools?"
    sims = vectors.similarities(embed_query(embed_model, question), sorted(docs), question)
    weighted_title = {source: five[4] for source, five in sims.items()}
    assert max(weighted_title, key=weighted_title.__getitem__) == "compare.md"
    assert weighted_title["start.md"] < weighted_title["compare.md"] - 0.1
