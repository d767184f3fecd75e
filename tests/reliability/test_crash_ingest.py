"""``kb-retrieval ingest`` killed with SIGKILL, then run again, converges to exactly the state of a clean ingest:
the same chunk ids, count, rows (content, fields, metadata except the write time, vectors) and L0 index file.

The kill comes at injected points (right after a write of chunks, before a delete of stale chunks, between writing
the new L0 index and putting it in place, a fixed time into the writes) in a subprocess running the CLI's ``main``,
and once from outside, to the real ``kb-retrieval`` console script, while it writes. Each run is killed on a fresh
ingest of a KB of a few dozen documents or on an edit of it (documents changed, removed and added).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kb_retrieval.config import KBSettings
from kb_retrieval.indexing.ingest import ingest
from kb_retrieval.indexing.milvus import connect, iter_rows
from tests.conftest import REPO
from tests.reliability.conftest import release_lite, write_kb
from tests.support.kb import offline_env

CATEGORIES = ("alpha", "beta", "gamma", "delta", "omega")
BATCH = 1  # KB_EMBED_BATCH_SIZE: chunks are written WINDOW_BATCHES (16) x 1 at a time, so a run makes several writes


def _doc(category: str, i: int, edition: str = "") -> str:
    name = f"{category.capitalize()}Service{i}Down"
    return (
        f"---\ntitle: {category} service {i} down{edition}\nkeywords: [{name}]\n---\n"
        f"# {category} service {i} down\n\n"
        f"## Diagnosis\nCheck the {category} service {i} logs for errors{edition}; compare the error rate with "
        f"the dashboard and look for a deploy in the last hour.\n\n"
        f"## Mitigation\nRoll back the last {category} deploy, or restart instance {i} and page its owner.\n"
    )


def kb_v1() -> dict[str, str]:
    return {f"{c}/svc{i}.md": _doc(c, i) for c in CATEGORIES for i in range(6)}  # 30 documents, 60 chunks


def kb_v2() -> dict[str, str]:
    docs = kb_v1()
    for c in CATEGORIES[:3]:  # 6 edited
        for i in (0, 1):
            docs[f"{c}/svc{i}.md"] = _doc(c, i, " (edition 2)")
    for c in CATEGORIES[3:]:  # 4 removed
        for i in (4, 5):
            del docs[f"{c}/svc{i}.md"]
    for i in range(6, 10):  # 4 added
        docs[f"omega/svc{i}.md"] = _doc("omega", i)
    return docs


def set_kb(root: Path, docs: dict[str, str]) -> Path:
    shutil.rmtree(root, ignore_errors=True)
    return write_kb(root, docs)


@dataclass(frozen=True)
class State:
    rows: dict[str, tuple[Any, ...]]  # id -> (source, category, content, metadata without the write time)
    vectors: dict[str, np.ndarray]
    l0: bytes
    l0_files: list[str]


def snapshot(settings: KBSettings) -> State:
    s = settings
    client = connect(s)
    client.load_collection(s.storage.collection)
    fields = [
        s.schema_fields.id_field,
        s.schema_fields.source_field,
        s.schema_fields.category_field,
        s.schema_fields.content_field,
        s.schema_fields.metadata_field,
        s.schema_fields.vector_field,
    ]
    rows, vectors = {}, {}
    for row in iter_rows(client, s, fields):
        meta = {k: v for k, v in row[s.schema_fields.metadata_field].items() if k != "ingested_at"}
        rows[row[s.schema_fields.id_field]] = (
            row[s.schema_fields.source_field],
            row[s.schema_fields.category_field],
            row[s.schema_fields.content_field],
            meta,
        )
        vectors[row[s.schema_fields.id_field]] = np.asarray(row[s.schema_fields.vector_field], dtype=np.float32)
    client.close()
    release_lite(s)  # one process per data dir: let the next subprocess open it
    l0 = s.l0_index_path()
    return State(rows, vectors, l0.read_bytes(), sorted(p.name for p in l0.parent.iterdir()))


@dataclass
class Crash:
    kb: Path
    clean: dict[str, State]  # "v1" / "v2": a clean ingest of that version into an empty state
    clean_v1_dir: Path
    work: Path


@pytest.fixture(scope="module")
def crash(tmp_path_factory, embed_model) -> Crash:
    work = tmp_path_factory.mktemp("crash")
    kb = work / "kb"
    clean: dict[str, State] = {}
    for version, docs in (("v2", kb_v2()), ("v1", kb_v1())):
        set_kb(kb, docs)
        settings = KBSettings(
            state_dir=work / f"clean-{version}"
        )  # the reference: batch size is the killed run's concern
        ingest([kb], settings, embed_model=embed_model)
        clean[version] = snapshot(settings)
    assert len(clean["v1"].rows) == 60 and clean["v1"].rows != clean["v2"].rows
    return Crash(kb, clean, work / "clean-v1", work)


def _env() -> dict[str, str]:
    return offline_env(KB_EMBED_BATCH_SIZE=str(BATCH), PYTHONPATH=str(REPO))


def _prepare(crash: Crash, name: str, start: str) -> KBSettings:
    """A state dir for one scenario: empty (a first ingest) or a copy of the clean v1 state (an edit)."""
    state = crash.work / name
    if start == "v1":
        shutil.copytree(crash.clean_v1_dir, state)
    set_kb(crash.kb, kb_v1() if start == "empty" else kb_v2())
    return KBSettings(state_dir=state)  # finishing in this process: only the killed run needs small batches


def _converge(settings: KBSettings, target: State, embed_model) -> State:
    again = ingest([settings.storage.state_dir.parent / "kb"], settings, embed_model=embed_model)
    state = snapshot(settings)
    assert set(state.rows) == set(target.rows), (
        f"chunk ids differ: {len(set(state.rows) - set(target.rows))} extra, "
        f"{len(set(target.rows) - set(state.rows))} missing (second run: {again})"
    )
    assert len(state.rows) == len(target.rows)
    assert state.rows == target.rows
    # Vectors: the same model on the same text, up to float noise from how texts were batched together (padding).
    worst = min(float(state.vectors[i] @ target.vectors[i]) for i in target.vectors)
    assert worst > 0.9999, f"a chunk's vector differs from a clean ingest's (cosine {worst:.6f})"
    assert state.l0 == target.l0, "the L0 index file differs from a clean ingest's"
    assert state.l0_files == target.l0_files, f"leftovers beside the L0 index: {state.l0_files}"
    return state


SCENARIOS = [  # (start, kill point): start "empty" ingests v1 from nothing, "v1" ingests the v2 edit over v1
    ("empty", "upsert:2"),
    ("empty", "l0-replace"),
    ("v1", "upsert:1"),
    ("v1", "before-delete:3"),
    ("v1", "after-write:0.3"),
]


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("start", "point"), SCENARIOS, ids=[f"{s}-{p}" for s, p in SCENARIOS])
def test_killed_at_an_injected_point_converges(crash: Crash, embed_model, start: str, point: str) -> None:
    settings = _prepare(crash, f"{start}-{point.replace(':', '-')}", start)
    command = [sys.executable, "-m", "tests.reliability.crash_driver", "--kill-at", point, "--"]
    command += ["ingest", str(crash.kb), "--state-dir", str(settings.storage.state_dir), "--json"]
    run = subprocess.run(command, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=240)
    assert run.returncode == -signal.SIGKILL, f"not killed at {point} (exit {run.returncode}):\n{run.stderr[-3000:]}"
    target = crash.clean["v1" if start == "empty" else "v2"]
    if point == "l0-replace":  # killed after every write: the old L0 index (none) is still in place
        assert not settings.l0_index_path().exists()
    _converge(settings, target, embed_model)


@pytest.mark.timeout(300)
def test_console_script_killed_while_writing_converges(crash: Crash, embed_model) -> None:
    settings = _prepare(crash, "v1-console-script", "v1")
    collection_dir = settings.resolved_milvus_uri() + "/collections/" + settings.storage.collection
    script = Path(sys.executable).parent / "kb-retrieval"
    before = _tree_bytes(collection_dir)
    command = [str(script), "ingest", str(crash.kb), "--state-dir", str(settings.storage.state_dir)]
    proc = subprocess.Popen(command, cwd=REPO, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 180
    while _tree_bytes(collection_dir) == before and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)  # until the first write of chunks lands on disk
    time.sleep(0.2)
    still_running = proc.poll() is None
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.stderr is not None
    stderr = proc.stderr.read().decode(errors="replace")
    proc.stderr.close()
    assert still_running, f"the ingest ended before it could be killed mid-write:\n{stderr[-3000:]}"
    _converge(settings, crash.clean["v2"], embed_model)


def _tree_bytes(path: str) -> int:
    total = 0
    for folder, _, files in os.walk(path):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(folder, name))
            except OSError:
                continue
    return total
