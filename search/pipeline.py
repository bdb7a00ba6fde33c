"""The search pipeline: retrieve with BM25 and/or dense, fuse, return a ranking with timings."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from search.bm25 import BM25Index
from search.dense import DenseIndex
from search.fusion import DEFAULT_RRF_K, rrf
from search.ranking import Ranking

MODES = ("bm25", "dense", "hybrid")
MAX_K = 1000
MAX_DEPTH = 1000


class SearchError(ValueError):
    """A search request that cannot be served as asked; the message names the parameter."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


@dataclass
class SearchResult:
    ranking: Ranking
    timings_ms: dict[str, float] = field(default_factory=dict)


class _Stopwatch:
    def __init__(self):
        self.timings: dict[str, float] = {}

    def time(self, stage: str, fn, *args):
        start = time.perf_counter()
        result = fn(*args)
        self.timings[stage] = (time.perf_counter() - start) * 1000
        return result


class SearchPipeline:
    """Stateless over shared, read-only indexes: safe to call from many threads at once.

    Hybrid mode fuses the top-`depth` of each retriever; `depth` is fixed per pipeline (or per
    request) and independent of `k`, so a document's fused score never depends on the page size.
    """

    def __init__(self, bm25: BM25Index, dense: DenseIndex, embedder, depth: int = 100, rrf_k: float = DEFAULT_RRF_K):
        self.bm25, self.dense, self.embedder = bm25, dense, embedder
        self.depth, self.rrf_k = depth, rrf_k

    def search(self, query: str, k: int = 10, mode: str = "hybrid", depth: int | None = None) -> SearchResult:
        if not isinstance(query, str) or not query.strip():
            raise SearchError("query", "must be a non-empty string")
        if mode not in MODES:
            raise SearchError("mode", f"unknown mode {mode!r}; valid: {', '.join(MODES)}")
        if not 1 <= k <= MAX_K:
            raise SearchError("k", f"must be between 1 and {MAX_K}, got {k}")
        depth = self.depth if depth is None else depth
        if not 1 <= depth <= MAX_DEPTH:
            raise SearchError("depth", f"must be between 1 and {MAX_DEPTH}, got {depth}")

        started = time.perf_counter()
        clock = _Stopwatch()
        # Single-retriever modes retrieve exactly k; hybrid fuses fixed-depth candidate lists.
        leg_depth = k if mode != "hybrid" else depth
        legs = []
        if mode in ("bm25", "hybrid"):
            legs.append(clock.time("bm25", self.bm25.search, query, leg_depth))
        if mode in ("dense", "hybrid"):
            vector = clock.time("embed", self.embedder.encode, [query])
            legs.append(clock.time("dense", self.dense.search, vector[0], leg_depth))
        ranking = clock.time("fusion", rrf, legs, self.rrf_k) if mode == "hybrid" else legs[0]
        clock.timings["total"] = (time.perf_counter() - started) * 1000
        return SearchResult(ranking.head(k), clock.timings)
