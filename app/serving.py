"""What the service is serving right now, and swapping it for a freshly opened index (hot reload)."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from indexer.store import OpenIndex, open_index
from search.pipeline import SearchPipeline

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Serving:
    """An index and its pipeline, swapped as one object so a request never mixes two indexes."""

    index: OpenIndex
    pipeline: SearchPipeline


class ReloadInProgress(RuntimeError):
    pass


class Reloader:
    """Opens the configured index side by side with the one being served, then swaps atomically.

    Requests already running keep the `Serving` they started with; the old index is released when
    the last of them finishes. A failed reload leaves the current index in service.
    """

    def __init__(self, app, settings, executor=None):
        self.app, self.settings, self.executor = app, settings, executor
        self._lock = threading.Lock()

    def open(self, index: OpenIndex) -> Serving:
        serving = Serving(index, index.pipeline(depth=self.settings.depth, executor=self.executor))
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
