"""The search pipeline: retrieve with BM25 and/or dense, fuse, return a ranking with timings."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from search.bm25 import BM25Index
from search.dense import DenseIndex
from search.fusion import RRF, Candidates, Fused, Fusion, fuse
from search.hubness import HUBNESS_METHODS, HubnessSearcher
from search.ranking import Ranking
from search.rerank import MAX_RERANK_DEPTH, Reranked, Reranker, check_weight

MODES = ("bm25", "dense", "hybrid")
MAX_K = 1000
MAX_DEPTH = 1000


class SearchError(ValueError):
    """A search request that cannot be served as asked; the message names the parameter."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


@dataclass(frozen=True)
class HubnessChoice:
    method: str = "none"  # none | qbnorm | dbnorm
    dynamic: bool = False  # DIS: correct only queries whose raw top-1 is in the bank's activation set


@dataclass
class SearchResult:
    ranking: Ranking
    timings_ms: dict[str, float] = field(default_factory=dict)
    fusion: Fusion | None = None
    fused: Fused | None = None  # hybrid only: candidates with every component, for `explain`
    reranked: Reranked | None = None

    @property
    def explainable(self) -> bool:
        return self.fused is not None or self.reranked is not None

    def explain(self, position: int) -> dict:
        """Every component of the score of the hit at `position` (hybrid or reranked)."""
        parts: dict = {"final": float(self.ranking.scores[position])}
        if self.reranked is not None:  # the final ranking is a prefix of the reranked one
            parts["rerank"] = {"score": float(self.reranked.rerank_score[position]), "weight": self.reranked.weight,
                               "first_stage_rank": int(self.reranked.first_stage_rank[position]),
                               "first_stage_score": float(self.reranked.first_stage_score[position])}
        if self.fused is not None:
            parts.update(self._fused_parts(position))
        return parts

    def _fused_parts(self, position: int) -> dict:
        fused = self.fused
        at = int(np.searchsorted(fused.candidates.doc_idx, self.ranking.doc_idx[position]))
        parts = {}
        for name in ("bm25", "dense"):
            rank = int(fused.candidates.ranks[name][at])
            parts[name] = {
                "score": float(fused.candidates.scores[name][at]),
                "rank": rank or None,
                "normalized": None if fused.normalized is None else float(fused.normalized[name][at]),
                "contribution": float(fused.contributions[name][at]),
            }
        return {"fused": float(fused.scores[at]), **parts}


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
    With an executor, the BM25 leg runs beside query embedding + dense search.
    """

    def __init__(self, bm25: BM25Index, dense: DenseIndex, embedder, embeddings: np.ndarray,
                 depth: int = 100, fusion: Fusion = RRF(), executor: ThreadPoolExecutor | None = None,
                 hubness: HubnessSearcher | None = None, hubness_default: HubnessChoice = HubnessChoice(),
                 reranker: Reranker | None = None):
        self.bm25, self.dense, self.embedder, self.embeddings = bm25, dense, embedder, embeddings
        self.depth, self.fusion, self.executor = depth, fusion, executor
        self.hubness, self.hubness_default = hubness, hubness_default
        self.reranker = reranker

    def _bm25_leg(self, query: str, depth: int, clock: _Stopwatch):
        scores = clock.time("bm25", self.bm25.scores, query)
        return scores, self.bm25.ranking_from_scores(scores, depth)

    def _dense_leg(self, query: str, depth: int, clock: _Stopwatch, hubness: HubnessChoice):
        """(query vector, ranking, bias coefficients): corrected over the whole corpus when asked."""
        vector = clock.time("embed", self.embedder.encode, [query])[0]
        if hubness.method == "none":
            return vector, clock.time("dense", self.dense.search, vector, depth), None
        ranking, coef = clock.time("dense", self.hubness.search, vector, depth, hubness.method, hubness.dynamic)
        return vector, ranking, coef

    def candidates(self, query: str, depth: int, clock: _Stopwatch | None = None,
                   hubness: HubnessChoice | None = None) -> Candidates:
        """Union of both top-`depth` lists, every document with its BM25 score and (corrected) cosine."""
        clock = clock or _Stopwatch()
        hubness = self._hubness_choice(hubness)
        if self.executor is not None:
            bm25_future = self.executor.submit(self._bm25_leg, query, depth, clock)
            vector, dense_ranking, coef = self._dense_leg(query, depth, clock, hubness)
            bm25_scores, bm25_ranking = bm25_future.result()
        else:
            bm25_scores, bm25_ranking = self._bm25_leg(query, depth, clock)
            vector, dense_ranking, coef = self._dense_leg(query, depth, clock, hubness)
        if coef is None:
            dense_scores, floors = (lambda idx: self.embeddings[idx] @ vector), None
        else:
            correction = self.hubness.correction
            dense_scores = lambda idx: correction.corrected(self.embeddings[idx] @ vector, idx, coef)  # noqa: E731
            floors = {"dense": correction.score_floor(coef)}
        return clock.time("candidates", Candidates.from_rankings, {"bm25": bm25_ranking, "dense": dense_ranking},
                          {"bm25": lambda idx: bm25_scores[idx], "dense": dense_scores}, floors)

    def _hubness_choice(self, choice: HubnessChoice | None) -> HubnessChoice:
        choice = choice or self.hubness_default
        if choice.method not in HUBNESS_METHODS:
            raise SearchError("hubness", f"unknown method {choice.method!r}; valid: {', '.join(HUBNESS_METHODS)}")
        if choice.method != "none" and self.hubness is None:
            raise SearchError("hubness", "this index has no fitted hubness correction (run `hybrid hubness fit`); use \"none\"")
        return choice

    def search(self, query: str, k: int = 10, mode: str = "hybrid", depth: int | None = None,
               fusion: Fusion | None = None, min_score: float | None = None,
               hubness: HubnessChoice | None = None, rerank: bool | None = None,
               rerank_depth: int | None = None, rerank_weight: float | None = None) -> SearchResult:
        """`min_score` applies to the final score: the fused (or single-retriever) score, or the
        reranker's (see search.rerank.interpolate) when reranking."""
        self._validate(query, k, mode, depth)
        hubness = self._hubness_choice(hubness)
        rerank_depth = self._rerank_depth(k, rerank, rerank_depth)
        if rerank_weight is not None:
            try:
                check_weight(rerank_weight)
            except ValueError as exc:
                raise SearchError("rerank_weight", str(exc)) from None
        started = time.perf_counter()
        clock = _Stopwatch()
        result = SearchResult(Ranking.empty())
        first_stage_k = max(k, rerank_depth or 0)
        if mode == "bm25":
            result.ranking = self._bm25_leg(query, first_stage_k, clock)[1]
        elif mode == "dense":
            result.ranking = self._dense_leg(query, first_stage_k, clock, hubness)[1]
        else:
            candidates = self.candidates(query, self.depth if depth is None else depth, clock, hubness)
            result.fusion = fusion or self.fusion
            result.fused = clock.time("fusion", fuse, candidates, result.fusion)
            result.ranking = result.fused.ranking()
        if rerank_depth:
            result.reranked = clock.time("rerank", self.reranker.rerank, query, result.ranking.head(rerank_depth),
                                         rerank_weight)
            result.ranking = result.reranked.ranking
        ranking = result.ranking
        if min_score is not None:
            # float64: a huge min_score must not overflow a float32 cast; scores descend
            ranking = ranking.head(int(np.count_nonzero(ranking.scores.astype(np.float64) >= min_score)))
        result.ranking = ranking.head(k)
        clock.timings["total"] = (time.perf_counter() - started) * 1000
        result.timings_ms = clock.timings
        return result

    def _rerank_depth(self, k: int, rerank: bool | None, depth: int | None) -> int | None:
        """How many first-stage candidates to rerank (None: no reranking)."""
        if rerank is None:
            rerank = self.reranker is not None and self.reranker.options.by_default
        if not rerank:
            return None
        if self.reranker is None:
            raise SearchError("rerank", "no reranker is configured (set HYBRID_RERANKER); use false")
        if depth is not None and not 1 <= depth <= MAX_RERANK_DEPTH:
            raise SearchError("rerank_depth", f"must be between 1 and {MAX_RERANK_DEPTH}, got {depth}")
        return max(k, self.reranker.options.depth if depth is None else depth)  # every returned hit is reranked

    @staticmethod
    def _validate(query, k, mode, depth) -> None:
        if not isinstance(query, str) or not query.strip():
            raise SearchError("query", "must be a non-empty string")
        if mode not in MODES:
            raise SearchError("mode", f"unknown mode {mode!r}; valid: {', '.join(MODES)}")
        if not 1 <= k <= MAX_K:
            raise SearchError("k", f"must be between 1 and {MAX_K}, got {k}")
        if depth is not None and not 1 <= depth <= MAX_DEPTH:
            raise SearchError("depth", f"must be between 1 and {MAX_DEPTH}, got {depth}")
