"""Benchmarks (``make bench``): retrieval quality against the stock LlamaIndex retrievers on the real corpora in
``../shared``, and speed. Development-only: needs the ``dev`` extra and is never imported by the lookup path."""
