"""What a process imports to look up: with BM25 in Milvus (the default), bm25s and numba (~0.6 s of imports) are
not loaded by ingest, by building a ``KnowledgeLookup`` or by a lookup; in-process BM25 still loads them."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.conftest import SAMPLE_KB
from tests.support.kb import offline_env

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


def _bare_env(**extra: str) -> dict[str, str]:
    """A child's whole environment: offline, a plain PATH, and ``extra``; nothing inherited from this process."""
    return offline_env({"PATH": "/usr/bin:/bin"}, **extra)


def _run(tmp_path, mode: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path / mode), str(SAMPLE_KB), mode],
        capture_output=True,
        text=True,
        timeout=600,
        env=_bare_env(),
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


CLI_SCRIPT = textwrap.dedent(
    """
    import contextlib, io, json, sys
    from kb_retrieval.cli import main

    state, kb = sys.argv[1:3]
    assert main(["ingest", kb, "--state-dir", state, "--json"]) == 0
    ingest_loaded = sorted(m for m in ("torch", "transformers", "sentence_transformers") if m in sys.modules)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["lookup", "--state-dir", state, "--json", "RedisMemoryHigh: used_memory above 90% of maxmemory"])
    result = json.loads(out.getvalue())
    print(json.dumps({"code": code, "path": result["retrievalTrace"]["attempts"][0]["path"], "ingest": ingest_loaded,
                      "modules": sorted(m for m in ("torch", "transformers", "sentence_transformers")
                                        if m in sys.modules)}))
    """
)


def test_cli_ingest_and_memory_plan_lookup_load_no_torch(tmp_path) -> None:
    """The CLI's ingest embeds with the ONNX passage encoder, its lookup with the ONNX query encoder: neither loads
    torch or transformers (the exports are cached first: writing one does load them)."""
    from kb_retrieval.config import KBSettings
    from kb_retrieval.indexing.onnx_query import onnx_model_file

    for quantized in (False, True):
        onnx_model_file(KBSettings().resolved_model_cache_dir(), quantized=quantized)
    proc = subprocess.run(
        [sys.executable, "-c", CLI_SCRIPT, str(tmp_path / "state"), str(SAMPLE_KB)],
        capture_output=True,
        text=True,
        timeout=900,
        env=_bare_env(HOME=str(Path.home())),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report == {"code": 0, "path": "memory", "ingest": [], "modules": []}


INGEST_SCRIPT = (
    "import sys; from kb_retrieval.config import KBSettings; from kb_retrieval.indexing.ingest import ingest; "
    "ingest([sys.argv[2]], KBSettings(state_dir=sys.argv[1]))"
)

DEFERRED_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from kb_retrieval.deferred_imports import defer_package_inits, deferred

    state, defer = sys.argv[1], sys.argv[2] == "defer"
    if defer:
        from kb_retrieval.deferred_imports import keep_pandas_out

        defer_package_inits()
        keep_pandas_out()
    from kb_retrieval.config import KBSettings
    from kb_retrieval.engine import KnowledgeLookup

    lookup = KnowledgeLookup(KBSettings(state_dir=state))
    result = lookup.lookup("RedisMemoryHigh: used_memory above 90% of maxmemory")
    lookup.close()
    heavy = ("llama_index.core.indices.base", "llama_index.core.chat_engine", "llama_index.core.query_engine", "torch",
             "banks", "llama_index.core.callbacks.token_counting", "pandas")
    report = {"found": result.found, "plan": result.retrieval_trace.attempts[0].path,
              "loaded": sorted(m for m in heavy if m in sys.modules), "deferred": deferred("llama_index.core")}
    import llama_index.core
    from llama_index.core import VectorStoreIndex  # asked for: the real __init__ runs now
    report["after"] = {"deferred": deferred("llama_index.core"), "index": VectorStoreIndex.__name__,
                       "handler": llama_index.core.global_handler,
                       "indices": "llama_index.core.indices.base" in sys.modules}
    print(json.dumps(report))
    """
)


def _lookup_report(state, mode: str) -> dict:
    env = _bare_env(HOME=str(Path.home()))
    proc = subprocess.run(
        [sys.executable, "-c", DEFERRED_SCRIPT, str(state), mode], capture_output=True, text=True, timeout=600, env=env
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_memory_plan_lookup_with_deferred_package_inits_loads_no_llama_index_indices(tmp_path) -> None:
    """What the CLI's in-process lookup does: LlamaIndex's package __init__ files deferred, a lookup through the memory
    plan never runs them (no indices, chat engines, query engines); asking the package for a name still works."""
    state = tmp_path / "state"
    env = _bare_env(HOME=str(Path.home()))
    ingested = subprocess.run(
        [sys.executable, "-c", INGEST_SCRIPT, str(state), str(SAMPLE_KB)], capture_output=True, text=True, env=env
    )
    assert ingested.returncode == 0, ingested.stderr[-2000:]
    deferred = _lookup_report(state, "defer")
    assert deferred["found"] is True and deferred["plan"] == "memory"
    assert deferred["loaded"] == [] and deferred["deferred"] is True
    assert deferred["after"] == {"deferred": False, "index": "VectorStoreIndex", "handler": None, "indices": True}
    # The check can fail: the same lookup without the deferral runs llama_index.core's __init__ and all it imports.
    plain = _lookup_report(state, "plain")
    assert plain["found"] is True
    assert {"llama_index.core.indices.base", "banks", "llama_index.core.callbacks.token_counting", "pandas"} <= set(
        plain["loaded"]
    )


def test_the_cli_lookup_defers_llama_index_package_inits(tmp_path) -> None:
    """``kb-retrieval lookup`` in a process of its own (``-X importtime`` lists every module it imports): the memory
    plan's lookup answers without importing ``llama_index.core.indices``; an import the CLI makes before the lookup
    would show here."""
    state = tmp_path / "state"
    env = _bare_env(HOME=str(Path.home()))
    ingested = subprocess.run(
        [sys.executable, "-c", INGEST_SCRIPT, str(state), str(SAMPLE_KB)], capture_output=True, text=True, env=env
    )
    assert ingested.returncode == 0, ingested.stderr[-2000:]
    query = "RedisMemoryHigh: used_memory above 90% of maxmemory"
    command = [sys.executable, "-X", "importtime", "-m", "kb_retrieval.cli", "lookup", "--state-dir", str(state)]
    proc = subprocess.run([*command, "--json", query], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout)
    assert result["found"] is True and result["retrievalTrace"]["attempts"][0]["path"] == "memory"
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert "kb_retrieval.engine" in imported  # the listing is complete enough to tell
    # Nor the package __init__ files of callbacks (the token counter) and prompts (rich templates: banks, jinja2),
    # nor pandas (the listing names "pandas" for pyarrow's two refused looks: its frame module tells a real import).
    heavy = {"llama_index.core.indices.base", "llama_index.core.chat_engine", "torch", "banks", "pandas.core.frame"}
    assert not (heavy | {"llama_index.core.callbacks.token_counting"}) & imported


def test_the_cli_ingest_defers_llama_index_package_inits(tmp_path) -> None:
    """``kb-retrieval ingest`` in a process of its own ingests without running LlamaIndex's package ``__init__``
    files (no indices, chat engines or torch); the library's ``ingest`` without the deferral does import them (the
    check can fail)."""
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PATH": "/usr/bin:/bin", "HOME": str(Path.home())}
    command = [sys.executable, "-X", "importtime", "-m", "kb_retrieval.cli", "ingest", str(SAMPLE_KB), "--json"]
    proc = subprocess.run(
        [*command, "--state-dir", str(tmp_path / "cli")], capture_output=True, text=True, timeout=600, env=env
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout)["chunks_embedded"] > 0
    heavy = {"llama_index.core.indices.base", "llama_index.core.chat_engine", "torch"}
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert "kb_retrieval.indexing.ingest" in imported  # the listing is complete enough to tell
    assert not heavy & imported
    library = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", INGEST_SCRIPT, str(tmp_path / "library"), str(SAMPLE_KB)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert library.returncode == 0, library.stderr[-2000:]
    assert "llama_index.core.indices.base" in {
        line.rsplit("|", 1)[-1].strip() for line in library.stderr.splitlines() if line.startswith("import time:")
    }


PANDAS_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from kb_retrieval.deferred_imports import keep_pandas_out

    keep_pandas_out()
    import pyarrow as pa
    import pymilvus.orm.schema as schema
    import pymilvus.orm.types as types

    report = {"started": "pandas" in sys.modules, "dataframe_before": isinstance([], schema.pd.DataFrame)}
    import pandas as pd  # the real pandas, whoever asks for it later
    frame = pd.DataFrame({"a": [1, 2]})
    report.update(
        real=pd.DataFrame.__module__.startswith("pandas"),
        dataframe=isinstance(frame, schema.pd.DataFrame),
        list_like=schema.is_list_like([1]) and not types.is_scalar([1]),
        to_pandas=pa.table({"a": [1, 2]}).to_pandas().equals(frame),
        from_pandas=pa.Table.from_pandas(frame).column("a").to_pylist(),
    )
    print(json.dumps(report))
    """
)


def test_keep_pandas_out_imports_pymilvus_and_pyarrow_without_pandas() -> None:
    """pymilvus and pyarrow start without pandas; pandas imported afterwards is the real one, and what pymilvus
    reads of it (``DataFrame`` checks, ``pandas.api.types``) and pyarrow's explicit conversions work with it."""
    proc = subprocess.run(
        [sys.executable, "-c", PANDAS_SCRIPT], capture_output=True, text=True, timeout=300, env=_bare_env()
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {
        "started": False,
        "dataframe_before": False,
        "real": True,
        "dataframe": True,
        "list_like": True,
        "to_pandas": True,
        "from_pandas": [1, 2],
    }


GUARD_SCRIPT = r"""
import json, sys
import kb_retrieval.deferred_imports as d

def broken():
    raise AttributeError("module 'pyarrow.lib' has no attribute '_pandas_api'")  # a pyarrow of another shape

d._pyarrow_without_pandas = broken
d.keep_pandas_out()
stand_ins = [n for n in ("pandas", "pandas.api.types") if isinstance(sys.modules.get(n), d._PandasStandIn)]
import pymilvus, pandas
real, client = hasattr(pandas, "read_csv"), hasattr(pymilvus, "MilvusClient")
print(json.dumps({"stand_ins": stand_ins, "real": real, "pymilvus": client}))
"""


def test_keep_pandas_out_is_only_a_start_up_cost_when_it_cannot_work() -> None:
    """A pyarrow or pymilvus of another shape than keep_pandas_out was written against makes it do nothing (the CLI
    lookup still starts, with pandas): no error, no stand-in left in sys.modules."""
    proc = subprocess.run(
        [sys.executable, "-c", GUARD_SCRIPT], capture_output=True, text=True, timeout=300, env=_bare_env()
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"stand_ins": [], "real": True, "pymilvus": True}
