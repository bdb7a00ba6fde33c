"""Where a collection embeds the documents written to it: the thread policy between ingest and searches. Its lock
guards the collection's own ONNX session of a limited number of cores, one caller at a time."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

import numpy as np

from hybrid_retrieval.indexer.build import EMBED_BATCH
from hybrid_retrieval.indexer.store import MODEL_DIR, OpenIndex
from hybrid_retrieval.models.embedder import OnnxEmbedder

EMBED_CHUNK = 32  # documents embedded per decision of where (all cores, or half while searches run)


class WriteEmbedding:
    """With `threads`, always on a session of that many cores, one batch at a time. Otherwise on all cores (the
    index's own session, the fastest ingest), except while `searching()` says searches are running: then each chunk
    of a batch goes to a session on half the cores, so writes cannot take every core from searches
    (docs/BENCHMARKS.md, "Live writes", measures both)."""

    def __init__(self, index: Callable[[], OpenIndex], threads: int | None = None, searching: Callable[[], bool] | None = None):
        self._index = index  # the current base (a compaction swaps it): its model and precision
        self.threads, self.searching = threads, searching
        self.limited: OnnxEmbedder | None = None  # the session of `threads` cores, made on first use
        self._lock = threading.Lock()

    def __call__(self, texts: list[str]) -> np.ndarray:
        if self.threads is not None:
            return self._on_limited(texts, self.threads)
        index = self._index()
        if self.searching is None:
            return index.embedder.encode(texts, batch_size=EMBED_BATCH)
        threads = max(1, len(os.sched_getaffinity(0)) // 2)
        return np.concatenate(
            [
                self._on_limited(chunk, threads) if self.searching() else index.embedder.encode(chunk, batch_size=EMBED_BATCH)
                for chunk in (texts[i : i + EMBED_CHUNK] for i in range(0, len(texts), EMBED_CHUNK))
            ]
        )

    def _on_limited(self, texts: list[str], threads: int) -> np.ndarray:
        with self._lock:
            if self.limited is None:
                index = self._index()
                precision = index.manifest.embedder.document_precision
                self.limited = OnnxEmbedder(index.path / MODEL_DIR, device="cpu", threads=threads, precision=precision)
            return self.limited.encode(texts, batch_size=EMBED_BATCH)
