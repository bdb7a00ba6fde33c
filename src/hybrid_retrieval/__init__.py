"""Hybrid lexical (BM25) + dense (FAISS) retrieval: indexing, fusion, hubness correction, reranking and the HTTP service.

Subpackages, highest layer first (the import-linter contracts in pyproject.toml, run by tests/test_layers.py): cli,
cluster (the only one that imports Ray), then the HTTP service (app) and offline evaluation side by side, training,
indexer, models, search, common. The service never imports training.
"""
