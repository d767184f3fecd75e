# Two commands on a fresh machine: `make demo` and `make test`. Both create .venv when it is missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: install demo test lint typecheck unit bench eval baselines screenshots clean deps-lowest

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c .ci/constraints-dev.txt -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/kb-retrieval demo --state-dir .kb-state/demo

lint: $(STAMP)
	$(BIN)/ruff check kb_retrieval sidecar tests
	$(BIN)/ruff format --check kb_retrieval sidecar tests

typecheck: $(STAMP)
	$(BIN)/mypy

test: lint typecheck
	$(BIN)/pytest

# The other end of the dependency ranges: the lowest torch / onnxruntime / onnx / llama-index-embeddings-huggingface
# pyproject.toml allows, in .venv-deps-lowest, and the tests that depend on them (.ci/deps-matrix says which).
deps-lowest:
	.ci/deps-matrix lowest

# Pure-logic tests (the `unit` marker: no model, no Milvus, no database server), for a fast edit-test loop.
unit: $(STAMP)
	$(BIN)/pytest -q -m unit

# The offline evaluation of the committed fixtures, into reports/local/ (untracked).
eval: $(STAMP)
	$(BIN)/kb-retrieval eval --golden golden/sample-kb.jsonl --fixtures golden/fixtures/sample-kb

# The committed baselines, regenerated from fresh ingests (tests/test_baselines.py checks they are current):
# the sample KB's fixtures, the offline evaluation of them, and the sidecar comparison on the runbooks corpus.
# Queries are embedded by the fp32 ONNX export: the default int8 one moves with the CPU's instruction set.
SHARED ?= ../shared
baselines: $(STAMP)
	rm -rf .kb-state/baselines golden/fixtures/sample-kb reports/retrieval-eval
	$(BIN)/kb-retrieval ingest kb_retrieval/sample_kb --state-dir .kb-state/baselines/sample
	KB_QUERY_ENCODER=onnx $(BIN)/kb-retrieval fixtures record --golden golden/sample-kb.jsonl --out golden/fixtures/sample-kb \
		--state-dir .kb-state/baselines/sample --mode sdk
	$(BIN)/kb-retrieval eval --golden golden/sample-kb.jsonl --fixtures golden/fixtures/sample-kb --out reports/retrieval-eval
	$(BIN)/kb-retrieval ingest $(SHARED)/corpora/runbooks --state-dir .kb-state/baselines/runbooks
	KB_QUERY_ENCODER=onnx $(BIN)/kb-retrieval compare --golden $(SHARED)/golden/runbooks-alerts-dev.jsonl --out reports/compare \
		--state-dir .kb-state/baselines/runbooks

bench: $(STAMP)
	$(BIN)/kb-retrieval bench --out reports/bench

# The README's screenshots of the retrieval-test page (docs/images/), taken by the tests that check it.
screenshots: $(STAMP)
	KB_WRITE_SCREENSHOTS=1 $(BIN)/pytest -q tests/service/test_page.py

clean:
	rm -rf .kb-state .pytest_cache .mypy_cache .ruff_cache
