"""What a process imports to look up: with BM25 in Milvus (the default), bm25s and numba (~0.6 s of imports) are
not loaded by ingest, by building a ``KnowledgeLookup`` or by a lookup; in-process BM25 still loads them."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from tests.conftest import SAMPLE_KB

SCRIPT = textwrap.dedent(
    """
    import json, sys
    from kb_retrieval.config import KBSettings
    from kb_retrieval.engine import KnowledgeLookup
    from kb_retrieval.indexing.ingest import ingest

    state, kb, mode = sys.argv[1:4]
    settings = KBSettings(state_dir=state)
    ingest([kb], settings)
    if mode == "in_process":
        settings = settings.model_copy(update={"lexical_text_field": ""})
    lookup = KnowledgeLookup(settings)
    result = lookup.lookup("RedisMemoryHigh: used_memory above 90% of maxmemory")
    print(json.dumps({"found": result.found, "lexical": result.retrieval_trace.attempts[0].lexical_mode,
                      "modules": sorted(m for m in ("bm25s", "numba") if m in sys.modules)}))
    lookup.close()
    """
)


def _run(tmp_path, mode: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path / mode), str(SAMPLE_KB), mode],
        capture_output=True,
        text=True,
        timeout=600,
        env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_bm25_in_milvus_imports_no_bm25s_or_numba(tmp_path) -> None:
    report = _run(tmp_path, "milvus")
    assert report == {"found": True, "lexical": "milvus_bm25", "modules": []}


def test_in_process_bm25_still_uses_bm25s(tmp_path) -> None:
    """The check above can fail: the same script with BM25 in process loads bm25s (and numba with it)."""
    report = _run(tmp_path, "in_process")
    assert report["lexical"] == "in_process_bm25"
    assert "bm25s" in report["modules"]
