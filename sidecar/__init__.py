"""The sidecar retriever: a stock LlamaIndex retriever over the same collection, off by default, run beside the
main path only to feed comparison reports. Not built yet (issue 5); nothing on the lookup path imports it."""
