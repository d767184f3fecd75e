"""One request, a module per stage: query transform (with L0 hints), L1 retrieval, rerank, dedupe, evidence,
context pack."""
