"""What the service is serving right now, and swapping it for a freshly opened index (hot reload)."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from indexer.store import OpenIndex, open_index
from models.batching import BatchingCrossEncoder, BatchingEmbedder
from search.pipeline import SearchPipeline
from search.rerank import RerankOptions

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Serving:
    """An index and its pipeline, swapped as one object so a request never mixes two indexes."""

    index: OpenIndex
    pipeline: SearchPipeline


def rerank_options(settings, batch: bool = False) -> RerankOptions | None:
    """The reranker the settings name, loaded once for the life of the service (reloads keep it)."""
    if not settings.reranker:
        return None
    from models.cross_encoder import load_cross_encoder, rerank_weight

    model = load_cross_encoder(settings.reranker, device=settings.device, precision=settings.reranker_precision)
    if batch:
        model = BatchingCrossEncoder(model)
    weight = rerank_weight(settings.reranker, settings.rerank_weight)
    logger.info("reranking with %s (%s) on the top %d, weight %g, by default=%s", settings.reranker,
                settings.reranker_precision, settings.rerank_depth, weight, settings.rerank_by_default)
    return RerankOptions(model, depth=settings.rerank_depth, by_default=settings.rerank_by_default, name=settings.reranker,
                         weight=weight)


class ReloadInProgress(RuntimeError):
    pass


class Reloader:
    """Opens the configured index side by side with the one being served, then swaps atomically.

    Requests already running keep the `Serving` they started with; the old index is released when
    the last of them finishes. A failed reload leaves the current index in service.
    """

    def __init__(self, app, settings, executor=None, rerank: RerankOptions | None = None, batch: bool = False):
        self.app, self.settings, self.executor, self.rerank, self.batch = app, settings, executor, rerank, batch
        self._lock = threading.Lock()

    def open(self, index: OpenIndex) -> Serving:
        embedder = BatchingEmbedder(index.embedder) if self.batch else None
        pipeline = index.pipeline(depth=self.settings.depth, executor=self.executor, rerank=self.rerank, embedder=embedder)
        serving = Serving(index, pipeline)
        self.app.state.serving = serving  # a single reference assignment: the swap is atomic
        self.app.state.metrics.describe_index(index.manifest, index.num_docs)
        logger.info("serving %s: %d documents, built %s", index.path, index.num_docs, index.manifest["created_at"])
        return serving

    def reload(self) -> Serving:
        if not self._lock.acquire(blocking=False):
            raise ReloadInProgress("a reload is already in progress")
        try:
            return self.open(open_index(self.settings.index, verify=self.settings.verify, device=self.settings.device))
        finally:
            self._lock.release()
