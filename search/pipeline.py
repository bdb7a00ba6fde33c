"""The search pipeline: retrieve with BM25 and/or dense, fuse, rerank; return a ranking with timings
and the spec it applied."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from search.bm25 import BM25Index
from search.dense import DenseIndex
from search.errors import SpecError
from search.fusion import Candidates, Fused, fuse
from search.hubness import HubnessSearcher
from search.ranking import Ranking
from search.rerank import Reranked, Reranker
from search.spec import HubnessSpec, SearchSpec, check_k


@dataclass
class SearchResult:
    ranking: Ranking
    spec: SearchSpec  # the spec applied
    timings_ms: dict[str, float] = field(default_factory=dict)
    fused: Fused | None = None  # hybrid only: candidates with every component, for `explain`
    reranked: Reranked | None = None

    @property
    def explainable(self) -> bool:
        return self.fused is not None or self.reranked is not None

    def explain(self, position: int) -> dict:
        """Every component of the score of the hit at `position` (hybrid or reranked)."""
        parts: dict = {"final": float(self.ranking.scores[position])}
        reranked = self.reranked
        if reranked is not None:  # the final ranking is a prefix of the reranked one
            parts["rerank"] = {"score": float(reranked.rerank_score[position]) if position < reranked.depth else None,
                               "weight": reranked.weight, "first_stage_rank": int(reranked.first_stage_rank[position]),
                               "first_stage_score": float(reranked.first_stage_score[position])}
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

    `defaults` is the spec a request's partial spec is merged onto (see search.spec). Hybrid mode fuses
    the top-`depth` of each retriever, independent of `k`, so a document's fused score never depends
    on the page size. With an executor, the BM25 leg runs beside query embedding + dense search.
    """

    def __init__(self, bm25: BM25Index, dense: DenseIndex, embedder, embeddings: np.ndarray,
                 defaults: SearchSpec = SearchSpec(), executor: ThreadPoolExecutor | None = None,
                 hubness: HubnessSearcher | None = None, reranker: Reranker | None = None):
        self.bm25, self.dense, self.embedder, self.embeddings = bm25, dense, embedder, embeddings
        self.executor, self.hubness, self.reranker = executor, hubness, reranker
        self.defaults = self._servable(defaults)

    def resolve(self, overrides: dict | None = None) -> SearchSpec:
        """The defaults with a request's partial spec merged on, checked against what this index can do."""
        return self._servable(self.defaults.merge(overrides))

    def _servable(self, spec: SearchSpec) -> SearchSpec:
        if spec.hubness.method != "none" and self.hubness is None:
            raise SpecError("hubness.method", "this index has no fitted hubness correction (run `hybrid hubness fit`); use \"none\"")
        if spec.rerank.enabled and self.reranker is None:
            raise SpecError("rerank.enabled", "no reranker is configured (the service's HYBRID_RERANKER, `hybrid search "
                                              "--reranker`); use false")
        return spec

    def _bm25_leg(self, query: str, depth: int, clock: _Stopwatch):
        scores = clock.time("bm25", self.bm25.scores, query)
        return scores, self.bm25.ranking_from_scores(scores, depth)

    def _dense_leg(self, query: str, depth: int, clock: _Stopwatch, hubness: HubnessSpec):
        """(query vector, ranking, bias coefficients): corrected over the whole corpus when asked."""
        vector = clock.time("embed", self.embedder.encode, [query])[0]
        if hubness.method == "none":
            return vector, clock.time("dense", self.dense.search, vector, depth), None
        ranking, coef = clock.time("dense", self.hubness.search, vector, depth, hubness.method, hubness.dynamic)
        return vector, ranking, coef

    def candidates(self, query: str, depth: int, hubness: HubnessSpec = HubnessSpec(),
                   clock: _Stopwatch | None = None) -> Candidates:
        """Union of both top-`depth` lists, every document with its BM25 score and (corrected) cosine."""
        clock = clock or _Stopwatch()
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

    def search(self, query: str, k: int = 10, spec: SearchSpec | dict | None = None) -> SearchResult:
        """The top `k` for `query` under `spec`: a full spec, or a partial one (dict form) merged onto the
        defaults. `min_score` applies to the final score: the fused (or single-retriever) score, or the
        reranker's (see search.rerank.interpolate) when reranking."""
        spec = spec if isinstance(spec, SearchSpec) else self.resolve(spec)
        if not isinstance(query, str) or not query.strip():
            raise SpecError("query", "must be a non-empty string")
        k = check_k(k)
        started = time.perf_counter()
        clock = _Stopwatch()
        rerank = spec.rerank
        first_stage_k = max(k, rerank.depth) if rerank.enabled else k
        fused = None
        if spec.mode == "bm25":
            ranking = self._bm25_leg(query, first_stage_k, clock)[1]
        elif spec.mode == "dense":
            ranking = self._dense_leg(query, first_stage_k, clock, spec.hubness)[1]
        else:
            fused = clock.time("fusion", fuse, self.candidates(query, spec.depth, spec.hubness, clock), spec.fusion)
            ranking = fused.ranking()
        reranked = None
        if rerank.enabled:
            reranked = clock.time("rerank", self.reranker.rerank, query, ranking.head(first_stage_k), rerank.depth, rerank.weight)
            ranking = reranked.ranking
        if spec.min_score is not None:
            # float64: a huge min_score must not overflow a float32 cast; scores descend
            ranking = ranking.head(int(np.count_nonzero(ranking.scores.astype(np.float64) >= spec.min_score)))
        clock.timings["total"] = (time.perf_counter() - started) * 1000
        return SearchResult(ranking.head(k), spec, clock.timings, fused, reranked)
