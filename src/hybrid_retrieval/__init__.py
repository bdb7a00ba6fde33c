"""Hybrid lexical (BM25) + dense (FAISS) retrieval: indexing, fusion, hubness correction, reranking and the HTTP service.

Subpackages, lowest layer first (tests/test_layers.py holds the contract): common, search, models, indexer,
training, evaluation, cli; the HTTP service (app) uses search, models and indexer only; cluster (Ray) sits beside
the CLI.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("hybrid-retrieval")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"
