"""BM25, a lexical signal beside the dense one, over the same chunks that are in Milvus: its analysis
(:mod:`.analysis`), its scoring in this process (:mod:`.in_process`, bm25s; :mod:`.postings`, Milvus Lite's formula
for the memory plan's mirror) and the relative scores every place reports (:mod:`.scores`).

Alert texts and runbooks share exact vocabulary (metric names, component names, "has not found all other cluster
members") that a small sentence-embedding model blurs. BM25 finds those chunks; Milvus still gives each its dense
similarity, so every candidate carries one comparable similarity.

Three places run BM25, with one analysis (:func:`analysed_text`: identifiers split into their words, lower case,
English stopwords dropped, Snowball English stems):

- **In Milvus** (``lexical_mode = milvus_bm25``, Milvus Lite 3.2 and Milvus >= 2.5): ingest writes the analysed text
  of each chunk (:func:`lexical_document`) into a VARCHAR field with Milvus' analyser on and a BM25 ``Function``
  into a sparse field; a lookup sends the analysed query as the BM25 request of its one ``hybrid_search`` call. The
  analysis is ours, not the engine's: Milvus Lite 3.2.2 ignores analyser filters (no stemming, no stopwords,
  measured), and its standard tokenizer leaves our already analysed words as they are, so both engines index the
  same terms.
- **In process** (``lexical_mode = in_process_bm25``, the fallback for engines without full-text search, e.g. the
  Milvus 2.3 server, and for collections made before it): :class:`LexicalIndex`, built in memory from the
  collection's rows when a lookup object is created and after another process's ingest; the lexical hits get their
  dense similarity from their vectors, read from Milvus by key beside the dense search and then kept
  (:mod:`kb_retrieval.retrieval.hybrid`).
- **In the memory plan's mirror** (:class:`Bm25Postings`): the analysed text the collection holds, scored as Milvus
  Lite scores it, so the mirror answers as the Milvus call would.

Example:
    >>> index = LexicalIndex.build([("c1", "Redis memory high", "redis"), ("c2", "MySQL lag", "mysql")])
    >>> [hit.chunk_id for hit in index.search("redis maxmemory reached", 5)]
    ['c1']
"""

from __future__ import annotations

from kb_retrieval.retrieval.bm25.analysis import (
    STOPWORDS_EN,
    analyse,
    analysed_text,
    lexical_document,
    lexical_header,
    stem,
    with_identifier_parts,
)
from kb_retrieval.retrieval.bm25.in_process import LexicalHit, LexicalIndex
from kb_retrieval.retrieval.bm25.postings import BM25_B, BM25_K1, Bm25Postings
from kb_retrieval.retrieval.bm25.scores import relative_to_best, top_k

__all__ = [
    "BM25_B",
    "BM25_K1",
    "STOPWORDS_EN",
    "Bm25Postings",
    "LexicalHit",
    "LexicalIndex",
    "analyse",
    "analysed_text",
    "lexical_document",
    "lexical_header",
    "relative_to_best",
    "stem",
    "top_k",
    "with_identifier_parts",
]
