"""A second embedding model, static: WordLlama's ``l2_supercat`` token table (256 dims), for ranking documents.

The document ranker's similarities all come from one bi-encoder (all-MiniLM-L6-v2), and where sibling runbooks are a
few hundredths apart under it ("receive" vs "transmit" errors, client vs server certificate) a second opinion from a
model trained differently separates some of them. A static model is cheap enough to ask for every lookup: a text's
vector is the mean of its word pieces' vectors (a table lookup, ~0.1 ms for a query), here one per document from the
same summary text as its summary vector (:mod:`kb_retrieval.indexing.doc_vectors`).

The table and tokenizer are data files of the PyPI package ``wordllama`` (MIT), read from where it is installed;
nothing is downloaded. The package itself is not imported: its loader looks for the tokenizer under a folder name
the wheel does not use and then fetches it from the Hugging Face hub, and importing it configures the root logger.
This module computes what ``WordLlamaInference.embed(texts, norm=True)`` computes (tested against it).

Example:
    >>> model = load_static_embedder()  # doctest: +SKIP
    >>> model.embed(["network interface transmit errors"]).shape  # doctest: +SKIP
    (1, 256)
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file
from tokenizers import Tokenizer

#: Names the static model in row hashes and traces; a change rewrites every document's vectors.
STATIC_MODEL = "wordllama:l2_supercat_256"
STATIC_DIM = 256
_PACKAGE = "wordllama"
_WEIGHTS = Path("weights") / "l2_supercat_256.safetensors"
_TOKENIZER = Path("tokenizers") / "l2_supercat_tokenizer_config.json"
_TENSOR = "embedding.weight"


class StaticModelMissingError(RuntimeError):
    """The static model's files are not installed."""


class StaticEmbedder:
    """Normalised mean of a text's token vectors (special tokens left out; a text without tokens is a zero row)."""

    def __init__(self, table: np.ndarray, tokenizer: Tokenizer) -> None:
        self.table = np.ascontiguousarray(table, dtype=np.float32)
        self.tokenizer = tokenizer
        self.tokenizer.no_padding()
        self.tokenizer.no_truncation()

    @property
    def dim(self) -> int:
        return int(self.table.shape[1])

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """An (n, dim) float32 array of unit rows."""
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        top = len(self.table) - 1
        for row, encoding in enumerate(self.tokenizer.encode_batch(list(texts), add_special_tokens=False)):
            if encoding.ids:
                out[row] = self.table[np.clip(np.asarray(encoding.ids), 0, top)].mean(axis=0)
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.where(norms == 0, 1.0, norms)


def static_model_files() -> tuple[Path, Path]:
    """(weights, tokenizer) of the installed ``wordllama`` package, without importing it."""
    spec = importlib.util.find_spec(_PACKAGE)
    roots = list(spec.submodule_search_locations or []) if spec is not None else []
    for root in map(Path, roots):
        weights, tokenizer = root / _WEIGHTS, root / _TOKENIZER
        if weights.is_file() and tokenizer.is_file():
            return weights, tokenizer
    raise StaticModelMissingError(
        f"the static model {STATIC_MODEL} needs the package '{_PACKAGE}' with {_WEIGHTS} and {_TOKENIZER} "
        f"(pip install wordllama); searched: {roots or 'not installed'}"
    )


@lru_cache(maxsize=1)
def load_static_embedder() -> StaticEmbedder:
    """The static model, loaded once per process (~16 MB of float16 table read into float32)."""
    weights, tokenizer = static_model_files()
    return StaticEmbedder(load_file(str(weights))[_TENSOR], Tokenizer.from_file(str(tokenizer)))
