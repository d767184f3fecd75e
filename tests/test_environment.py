"""Library code leaves the process environment alone (issue 24): importing, ingesting and building lookups (ONNX
and torch query encoders) change no ``os.environ`` entry, and the bundled model still loads offline without
HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE (local paths, ``local_files_only``). Only the CLI sets them, for itself."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import REPO, SAMPLE_KB

SCRIPT = """
import json, os, sys
# torch and its OpenMP runtime set variables of their own when imported (KMP_*, TORCHINDUCTOR_CACHE_DIR): imported
# first, so what is compared is what kb_retrieval's own code does.
import torch, transformers, sentence_transformers, onnxruntime, tokenizers, pymilvus
before = dict(os.environ)
from kb_retrieval import KBSettings, KnowledgeLookup, ingest
settings = KBSettings(state_dir=sys.argv[1], vector_store_mode="sdk")
ingest([sys.argv[2]], settings)  # loads the torch model (passages)
found = []
for encoder in ("onnx-int8", "model"):
    lookup = KnowledgeLookup(settings.model_copy(update={"query_encoder": encoder}))
    found.append(lookup.lookup("RedisMemoryHigh on cache-01").evidence_blocks[0].source)
    lookup.close()
after = dict(os.environ)
changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
print(json.dumps({"changed": changed, "found": found}))
"""

MODEL_VARIABLES = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "TOKENIZERS_PARALLELISM")


def test_building_and_using_a_lookup_leaves_the_environment_unchanged(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in MODEL_VARIABLES}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "state"), str(SAMPLE_KB / "redis")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    import json

    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report == {"changed": [], "found": ["memory-usage-high.md", "memory-usage-high.md"]}


def test_the_cli_sets_what_it_needs_for_itself():
    from kb_retrieval.cli.run import CLI_ENVIRONMENT

    assert set(CLI_ENVIRONMENT) == set(MODEL_VARIABLES)
