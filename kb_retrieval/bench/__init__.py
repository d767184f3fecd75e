"""Benchmarks (``make bench``): retrieval quality against the stock LlamaIndex retrievers on the real corpora in
``../shared``, and speed. Development-only: needs the ``dev`` extra and is never imported by the lookup path."""

#: The parts of ``make bench``; ``kb-retrieval bench --only PART`` re-runs one and keeps the others' figures. Here, in
#: the package's light ``__init__``, so that the CLI's parser names them without importing the benchmarks.
PARTS = ("quality", "speed", "scale", "serve")
