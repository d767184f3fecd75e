"""The state snapshot: a later lookup object loads what the first one read from every chunk, and gives the same
answers; a new index version, a damaged or foreign file, or an ingest during the read means a read from Milvus."""

from __future__ import annotations

import hashlib
import json
import logging
import pickle
import shutil
from pathlib import Path

import pytest

from kb_retrieval import state
from kb_retrieval.config import KBSettings
from kb_retrieval.engine import KnowledgeLookup
from kb_retrieval.indexing import snapshot
from kb_retrieval.indexing.ingest import ingest
from kb_retrieval.indexing.milvus import release_lite
from kb_retrieval.indexing.snapshot import snapshot_dir, snapshot_key
from tests.conftest import SAMPLE_KB

QUERIES = [
    "RedisMemoryHigh on cache-01",
    "disk almost full on the database host",
    "how do I rotate the TLS certificate",
    "kafka consumer lag keeps growing",
]


def _answers(lookup: KnowledgeLookup) -> list[list[tuple[str, float, str, list[str]]]]:
    """Every query's evidence: source, score, content and reasons of each block."""
    out = []
    for query in QUERIES:
        result = lookup.lookup(query)
        out.append([(b.source, b.score, b.content, list(b.hit_reasons)) for b in result.evidence_blocks])
    return out


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory, embed_model) -> tuple[Path, Path]:
    """The sample KB copied and ingested once (a state dir no lookup object has opened yet)."""
    root = tmp_path_factory.mktemp("snapshot-template")
    kb = root / "kb"
    shutil.copytree(SAMPLE_KB, kb)
    settings = KBSettings(state_dir=root / "state")
    ingest([kb], settings, embed_model=embed_model)
    release_lite(settings)  # closed, so each test copies a whole data dir
    return root / "state", kb


@pytest.fixture
def kb_state(template: tuple[Path, Path], tmp_path: Path) -> tuple[KBSettings, Path]:
    """A state dir of this test's own: a copy of the template's."""
    state, kb = template
    shutil.copytree(state, tmp_path / "state")
    return KBSettings(state_dir=tmp_path / "state"), kb


def _no_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any read of every chunk fails the test: the state must come from the snapshot."""

    def refuse(*args, **kwargs):
        raise AssertionError("the collection was read row by row")

    monkeypatch.setattr("kb_retrieval.retrieval.l1.memory.iter_rows", refuse)
    monkeypatch.setattr("kb_retrieval.state.iter_rows", refuse)


def test_a_later_lookup_loads_the_snapshot_and_answers_the_same(kb_state, monkeypatch):
    settings, _ = kb_state
    first = KnowledgeLookup(settings)
    assert first.plan == "memory" and first.state_source == "milvus"
    files = list(snapshot_dir(settings).glob("*.snapshot"))
    assert len(files) == 1
    expected = _answers(first)
    first.close()

    _no_reads(monkeypatch)
    later = KnowledgeLookup(settings)
    assert later.state_source == "snapshot"
    assert later.exact is not None and later.memory is not None and len(later.memory) == len(first.memory)
    assert _answers(later) == expected
    later.close()
    monkeypatch.undo()

    # And both are what a lookup object that never snapshots answers.
    plain = KnowledgeLookup(settings.model_copy(update={"state_snapshots": False}))
    assert plain.state_source == "milvus"
    assert _answers(plain) == expected
    plain.close()


def test_a_state_dir_moved_whole_keeps_its_snapshot_and_calibration(kb_state, tmp_path, monkeypatch):
    """A state dir built once and then moved or copied (a prepared image, another machine's path) opens from its
    snapshot and keeps its measured calibration: their keys hold the Milvus Lite file's place in the state dir, not
    its absolute path. The same answers."""
    settings, _ = kb_state
    first = KnowledgeLookup(settings)
    expected = _answers(first)
    first.close()
    release_lite(settings)
    moved = tmp_path / "elsewhere" / "state"
    shutil.move(settings.storage.state_dir, moved)
    _no_reads(monkeypatch)

    def no_measure(*args, **kwargs):
        raise AssertionError("the calibration was measured again")

    monkeypatch.setattr("kb_retrieval.retrieval.calibration.measure", no_measure)
    later = KnowledgeLookup(KBSettings(state_dir=moved))
    assert later.state_source == "snapshot"
    assert _answers(later) == expected
    later.close()


def test_a_new_index_version_is_read_from_milvus_and_replaces_the_snapshot(tmp_path, embed_model):
    kb = tmp_path / "kb"
    shutil.copytree(SAMPLE_KB, kb)
    settings = KBSettings(state_dir=tmp_path / "state")
    ingest([kb], settings, embed_model=embed_model)
    KnowledgeLookup(settings).close()
    [old] = snapshot_dir(settings).glob("*.snapshot")
    page = sorted(kb.rglob("*.md"))[0]
    page.write_text(page.read_text(encoding="utf-8") + "\n\nSee also the conntrack table size.\n", encoding="utf-8")
    ingest([kb], settings, embed_model=embed_model)

    lookup = KnowledgeLookup(settings)
    assert lookup.state_source == "milvus"
    [new] = snapshot_dir(settings).glob("*.snapshot")
    assert new != old
    assert any("conntrack" in str(row.get(settings.schema_fields.content_field, "")) for row in lookup.memory.rows)
    lookup.close()


def test_a_damaged_snapshot_is_read_past_and_replaced(kb_state, caplog):
    settings, _ = kb_state
    KnowledgeLookup(settings).close()
    [path] = snapshot_dir(settings).glob("*.snapshot")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])

    with caplog.at_level(logging.WARNING, logger="kb_retrieval.indexing.snapshot"):
        lookup = KnowledgeLookup(settings)
    assert lookup.state_source == "milvus"
    assert "does not load" in caplog.text and path.name in caplog.text
    lookup.close()
    assert KnowledgeLookup(settings).state_source == "snapshot"


def _flip_signs(payload: bytearray) -> None:
    """The sign bit of every float32 in the payload's second half (little-endian: the high bit of each 4th byte)."""
    for i in range(len(payload) // 2 + 3, len(payload), 4):
        payload[i] ^= 0x80


def _zero_80k(payload: bytearray) -> None:
    start = len(payload) // 3
    payload[start : start + 80_000] = bytes(len(payload[start : start + 80_000]))


@pytest.mark.parametrize("damage", [_flip_signs, _zero_80k], ids=["signs-flipped", "80kb-zeroed"])
def test_a_snapshot_whose_payload_changed_on_disk_is_a_miss_with_a_warning_and_rebuilt(kb_state, damage, caplog):
    settings, _ = kb_state
    first = KnowledgeLookup(settings)
    expected = _answers(first)
    first.close()
    [path] = snapshot_dir(settings).glob("*.snapshot")
    header, payload = path.read_bytes().split(b"\n", 1)
    damaged = bytearray(payload)
    damage(damaged)
    assert damaged != payload
    path.write_bytes(header + b"\n" + bytes(damaged))  # the header as written: only the payload changed

    with caplog.at_level(logging.WARNING, logger="kb_retrieval.indexing.snapshot"):
        lookup = KnowledgeLookup(settings)
    assert lookup.state_source == "milvus"
    assert "does not match the digest" in caplog.text and path.name in caplog.text
    assert _answers(lookup) == expected
    lookup.close()
    rewritten = path.read_bytes().split(b"\n", 1)[1]  # from the collection, with its own digest
    assert rewritten != bytes(damaged)
    again = KnowledgeLookup(settings)
    assert again.state_source == "snapshot"
    again.close()


class _Planted:
    """A pickle that would create a file when loaded (what a tampered snapshot could do)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_a_snapshot_naming_another_class_is_refused_not_run(kb_state, tmp_path, caplog):
    settings, _ = kb_state
    KnowledgeLookup(settings).close()
    [path] = snapshot_dir(settings).glob("*.snapshot")
    header = json.loads(path.read_bytes().split(b"\n", 1)[0])  # the right format and key: the payload is foreign
    marker = tmp_path / "ran"
    payload = pickle.dumps(_Planted(marker))
    header["sha256"] = hashlib.sha256(payload).hexdigest()  # and its digest rewritten to match, as a tamperer would
    path.write_bytes(json.dumps(header).encode() + b"\n" + payload)

    with caplog.at_level(logging.WARNING, logger="kb_retrieval.indexing.snapshot"):
        lookup = KnowledgeLookup(settings)
    assert not marker.exists()
    assert lookup.state_source == "milvus"
    assert "may not hold pathlib" in caplog.text
    lookup.close()


def test_no_snapshot_is_kept_when_an_ingest_published_during_the_read(kb_state, monkeypatch):
    settings, _ = kb_state
    real = state._write_snapshot

    def racing(client, settings, key, version, parts):
        monkeypatch.setattr("kb_retrieval.state.index_version", lambda *a, **k: "another version")
        real(client, settings, key, version, parts)

    monkeypatch.setattr(state, "_write_snapshot", racing)
    lookup = KnowledgeLookup(settings)
    assert lookup.state_source == "milvus"
    assert not list(snapshot_dir(settings).glob("*.snapshot"))
    lookup.close()


def test_a_write_that_fails_leaves_no_file_and_the_lookup_works(kb_state, monkeypatch, caplog):
    settings, _ = kb_state

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(snapshot.pickle, "dump", full_disk)
    with caplog.at_level(logging.WARNING, logger="kb_retrieval.indexing.snapshot"):
        lookup = KnowledgeLookup(settings)
    assert "not written" in caplog.text and "No space left" in caplog.text
    assert not [p for p in snapshot_dir(settings).iterdir()]  # neither a snapshot nor a temporary file
    assert lookup.lookup(QUERIES[0]).found
    lookup.close()


@pytest.mark.unit
def test_the_key_follows_what_the_parts_are_built_from(tmp_path):
    settings = KBSettings(state_dir=tmp_path)
    key = snapshot_key(settings, "abc:1", plan="memory", lexical_mode="milvus_bm25")
    assert key and key == snapshot_key(settings, "abc:1", plan="memory", lexical_mode="milvus_bm25")
    changed = [
        snapshot_key(settings, "abc:2", plan="memory", lexical_mode="milvus_bm25"),
        snapshot_key(settings, "abc:1", plan="milvus", lexical_mode="milvus_bm25"),
        snapshot_key(
            settings.model_copy(update={"collection": "other"}), "abc:1", plan="memory", lexical_mode="milvus_bm25"
        ),
        snapshot_key(
            settings.model_copy(update={"content_field": "body"}), "abc:1", plan="memory", lexical_mode="milvus_bm25"
        ),
        snapshot_key(
            settings.model_copy(update={"milvus_uri": "http://milvus:19530"}),
            "abc:1",
            plan="memory",
            lexical_mode="milvus_bm25",
        ),
    ]
    assert None not in changed and len({key, *changed}) == 1 + len(changed)
    # KBSettings that do not change what is read from the chunks keep the key.
    assert key == snapshot_key(
        settings.model_copy(update={"top_k": 7}), "abc:1", plan="memory", lexical_mode="milvus_bm25"
    )
    # No snapshot: switched off, an unversioned collection, BM25 in process (its tokenizer does not pickle).
    assert (
        snapshot_key(
            settings.model_copy(update={"state_snapshots": False}), "abc:1", plan="memory", lexical_mode="milvus_bm25"
        )
        is None
    )
    assert snapshot_key(settings, "", plan="memory", lexical_mode="milvus_bm25") is None
    assert snapshot_key(settings, "abc:1", plan="memory", lexical_mode="in_process_bm25") is None
