"""A full disk, a read-only disk and damaged files under the state dir, as the commands meet them: one line saying what
is wrong and where (no traceback), and once the space is freed the state works again, nothing to repair by hand.

The state dir lives on a small tmpfs (``mount -t tmpfs -o size=20m``), filled to a few KB with a file; the tests
that need a mount are skipped, saying so, where mounting is not allowed (not root, a container without the right).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from kb_retrieval.config import KBSettings
from kb_retrieval.indexing.ingest import ingest
from kb_retrieval.indexing.lite_files import check_lite_files
from kb_retrieval.indexing.milvus import release_lite
from tests.conftest import SAMPLE_KB
from tests.support.kb import offline_env

pytestmark = pytest.mark.timeout(900)
QUERY = "RedisMemoryHigh: Redis memory usage above 90% of maxmemory"
NEW_DOC = "---\ntitle: Redis lazyfree tuning\ncategory: redis\n---\n# Redis lazyfree tuning\n\n" + "\n\n".join(
    f"## Part {i}\nlazyfree-lazy-eviction frees the memory of big keys in a background thread ({i})." for i in range(40)
)


def run_cli(*args: str, umask: int | None = None) -> subprocess.CompletedProcess[str]:
    env = offline_env()
    return subprocess.run(
        [sys.executable, "-m", "kb_retrieval.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
        preexec_fn=(lambda: os.umask(umask)) if umask is not None else None,
    )


def assert_one_line_error(done: subprocess.CompletedProcess[str], *fragments: str) -> str:
    assert done.returncode == 2, (done.stdout[-2000:], done.stderr[-3000:])
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    # Library records are one line each in the CLI's style too (`error: ...`); the command's own line comes last.
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert errors, done.stderr[-3000:]
    line = errors[-1]
    for fragment in fragments:
        assert fragment in line, line
    return line


def index_files(state: Path) -> list[Path]:
    return sorted(state.glob("milvus.db/collections/*/partitions/*/indexes/*.idx"))


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory, embed_model) -> tuple[Path, Path]:
    """One sample-KB folder ingested once (its index files written by ingest's load), closed for other processes."""
    root = tmp_path_factory.mktemp("full-disk")
    kb = root / "kb"
    shutil.copytree(SAMPLE_KB / "redis", kb / "redis")
    settings = KBSettings(state_dir=root / "state")
    ingest([kb], settings, embed_model=embed_model)
    release_lite(settings)
    return root / "state", kb


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 20 MB tmpfs of this test's own (skipped where mounting is not allowed)."""
    mount = tmp_path / "tmpfs"
    mount.mkdir()
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=20m", "tmpfs", str(mount)], capture_output=True, text=True, check=False
    )
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({made.stderr.strip() or 'mount failed'}): needs root")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(mount: Path, leave_bytes: int) -> Path:
    """A file taking all the space of ``mount`` but ``leave_bytes``."""
    filler = mount / f"filler-{uuid.uuid4().hex[:6]}"
    free = shutil.disk_usage(mount).free
    subprocess.run(["fallocate", "-l", str(max(0, free - leave_bytes)), str(filler)], check=True)
    return filler


def test_a_first_load_on_a_full_disk_fails_in_one_line_and_heals_once_space_is_freed(template, tmpfs):
    state = tmpfs / "state"
    shutil.copytree(template[0], state)
    for path in index_files(state):  # as after an ingest by an older version: the first load writes them
        path.unlink()
    filler = fill(tmpfs, 40_000)

    full = run_cli("lookup", QUERY, "--state-dir", str(state))
    assert_one_line_error(full, "Milvus:", "ran out of space")
    assert any(p.stat().st_size for p in index_files(state))  # Lite left an index file cut short

    filler.unlink()
    healed = run_cli("lookup", QUERY, "--json", "--state-dir", str(state))
    assert healed.returncode == 0, healed.stderr[-3000:]
    assert '"found": true' in healed.stdout
    assert "is damaged" in healed.stderr and "removed, Milvus Lite rebuilds it" in healed.stderr
    assert check_lite_files(state / "milvus.db") == []  # whole again


def test_an_ingest_on_a_full_disk_leaves_the_previous_state_usable(template, tmpfs):
    state, kb = tmpfs / "state", template[1]  # the folder the state was ingested from (its source ids)
    shutil.copytree(template[0], state)
    before = run_cli("lookup", QUERY, "--json", "--state-dir", str(state))
    assert before.returncode == 0, before.stderr[-3000:]
    new_doc = kb / "redis" / "lazyfree-tuning.md"
    new_doc.write_text(NEW_DOC, encoding="utf-8")
    try:
        _ingest_on_a_full_disk(tmpfs, state, kb)
    finally:
        new_doc.unlink()


def _ingest_on_a_full_disk(tmpfs: Path, state: Path, kb: Path) -> None:
    filler = fill(tmpfs, 8_000)

    failed = run_cli("ingest", str(kb), "--state-dir", str(state))
    assert failed.returncode != 0 and "Traceback" not in failed.stderr, failed.stderr[-3000:]
    assert [line for line in failed.stderr.splitlines() if line.startswith("error: ")]

    filler.unlink()
    after = run_cli("lookup", QUERY, "--json", "--state-dir", str(state))
    assert after.returncode == 0, after.stderr[-3000:]
    assert '"found": true' in after.stdout
    again = run_cli("ingest", str(kb), "--state-dir", str(state))
    assert again.returncode == 0, again.stderr[-3000:]
    found = run_cli("lookup", "lazyfree-lazy-eviction big keys background thread", "--json", "--state-dir", str(state))
    assert found.returncode == 0 and "lazyfree-tuning.md" in found.stdout


def test_a_read_only_state_dir_is_one_line(template, tmpfs):
    state = tmpfs / "state"
    shutil.copytree(template[0], state)
    subprocess.run(["mount", "-o", "remount,ro", str(tmpfs)], check=True)
    done = run_cli("stats", "--state-dir", str(state))
    assert_one_line_error(done, "Read-only file system", str(state / "milvus.db"))
    assert "milvus_lite" not in done.stderr


def test_a_truncated_data_segment_is_named_with_the_fix(template, tmp_path):
    state = tmp_path / "state"
    shutil.copytree(template[0], state)
    [segment] = sorted(state.glob("milvus.db/collections/kb_chunks/partitions/*/data/*.parquet"))
    with segment.open("r+b") as handle:
        handle.truncate(segment.stat().st_size // 2)
    for command in (["stats"], ["lookup", QUERY]):
        done = run_cli(*command, "--state-dir", str(state))
        assert_one_line_error(done, segment.name, "is damaged", "kb-retrieval ingest")


def test_an_empty_segment_no_manifest_names_is_left_to_lite(template, tmp_path):
    """A kill mid-flush leaves the segment Lite was writing, empty, before the manifest naming it: that is not the
    data (the next ingest writes those rows again), so nothing is refused, and Lite's recovery deletes it on open."""
    state = tmp_path / "state"
    shutil.copytree(template[0], state)
    [segment] = sorted(state.glob("milvus.db/collections/kb_chunks/partitions/*/data/*.parquet"))
    orphan = segment.with_name("data_999990_999999.parquet")
    orphan.touch()
    assert check_lite_files(state / "milvus.db") == []
    done = run_cli("lookup", QUERY, "--json", "--state-dir", str(state))
    assert done.returncode == 0 and '"found": true' in done.stdout, done.stderr[-3000:]
    assert not orphan.exists() and segment.exists()


def test_a_truncated_index_file_is_rebuilt(template, tmp_path):
    state = tmp_path / "state"
    shutil.copytree(template[0], state)
    [index] = [p for p in index_files(state) if "kb_chunks/" in str(p)]
    size = index.stat().st_size
    with index.open("r+b") as handle:
        handle.truncate(size // 3)
    done = run_cli("lookup", QUERY, "--json", "--state-dir", str(state))
    assert done.returncode == 0 and '"found": true' in done.stdout, done.stderr[-3000:]
    assert index.name in done.stderr and "removed, Milvus Lite rebuilds it" in done.stderr
    assert index.stat().st_size == size


def test_files_are_private_under_umask_000(template, tmp_path):
    state = tmp_path / "state"
    shutil.copytree(template[0], state)
    for path in index_files(state):
        path.unlink()  # written again by this process's first load
    done = run_cli("lookup", QUERY, "--state-dir", str(state), umask=0)
    assert done.returncode == 0, done.stderr[-3000:]
    assert index_files(state)
    for path in [*index_files(state), state / "traces.db"]:  # what this process created
        assert path.stat().st_mode & 0o077 == 0, (path, oct(path.stat().st_mode))


def test_a_missing_data_segment_or_garbage_manifest_is_named(template, tmp_path):
    state = tmp_path / "state"
    shutil.copytree(template[0], state)
    [segment] = sorted(state.glob("milvus.db/collections/kb_chunks/partitions/*/data/*.parquet"))
    segment.unlink()
    assert_one_line_error(run_cli("stats", "--state-dir", str(state)), segment.name, "missing, named by manifest.json")
    shutil.rmtree(state)
    shutil.copytree(template[0], state)
    manifest = state / "milvus.db" / "collections" / "kb_chunks" / "manifest.json"
    manifest.write_text("{garbage", encoding="utf-8")
    assert_one_line_error(run_cli("stats", "--state-dir", str(state)), str(manifest), "not valid JSON")


def test_a_trace_write_on_a_full_disk_loses_that_row_only(template, tmpfs):
    state = tmpfs / "state"
    shutil.copytree(template[0], state)
    first = run_cli("lookup", QUERY, "--json", "--state-dir", str(state))  # index files and traces.db written
    assert first.returncode == 0, first.stderr[-3000:]
    filler = fill(tmpfs, 0)

    full = run_cli("lookup", QUERY, "--json", "--state-dir", str(state))
    assert full.returncode == 0 and '"found": true' in full.stdout, full.stderr[-3000:]  # the answer is not lost
    assert "Traceback" not in full.stderr

    filler.unlink()
    again = run_cli("lookup", QUERY, "--json", "--state-dir", str(state))
    assert again.returncode == 0, again.stderr[-3000:]
    traces = run_cli("traces", "--json", "--state-dir", str(state))
    assert traces.returncode == 0, traces.stderr[-3000:]
    assert len(traces.stdout.splitlines()) in (2, 3)  # the first and the last; the full disk's row at most
