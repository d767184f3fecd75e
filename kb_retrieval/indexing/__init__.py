"""Writing the index: embeddings, the Milvus collection, incremental ingest and the L0 index."""
