"""Fusion of BM25 and dense candidates into one ranking.

Reciprocal Rank Fusion (Cormack, Clarke, Buettcher, SIGIR 2009):
    rrf(d) = sum over retrievers o of  w_o / (rrf_k + rank_o(d)),   ranks start at 1;
    a document outside retriever o's top-`depth` list gets nothing from o.
Convex combination (Bruch, Gai, Ingber, ACM TOIS 2023):
    cc(d) = alpha * phi(s_dense(d)) + (1 - alpha) * phi(s_bm25(d)),
    phi a per-query normalisation over the candidates (see search.normalize).

Every candidate carries both raw scores (the BM25 score of a dense-only document is read from the
BM25 index, the cosine of a BM25-only document from its stored vector): nothing is imputed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

import numpy as np

from search.normalize import NORMALIZERS, THEORETICAL_MIN, normalize
from search.ranking import Ranking, top_k

DEFAULT_RRF_K = 60.0
RETRIEVERS = ("bm25", "dense")
FUSION_METHODS = ("rrf", "cc")


@dataclass(frozen=True)
class RRF:
    rrf_k: float = DEFAULT_RRF_K
    weights: tuple[float, float] = (1.0, 1.0)  # (bm25, dense)
    method: str = "rrf"

    def __post_init__(self):
        if not np.isfinite(self.rrf_k) or self.rrf_k < 0:
            raise ValueError(f"rrf_k must be a finite number >= 0, got {self.rrf_k}")
        if len(self.weights) != 2 or not all(np.isfinite(w) and w >= 0 for w in self.weights):
            raise ValueError(f"weights must be two finite numbers >= 0 (bm25, dense), got {self.weights}")


@dataclass(frozen=True)
class ConvexCombination:
    alpha: float = 0.5  # weight of the dense retriever
    norm: str = "minmax"
    method: str = "cc"

    def __post_init__(self):
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"alpha must be between 0 and 1, got {self.alpha}")
        if self.norm not in NORMALIZERS:
            raise ValueError(f"unknown normalisation {self.norm!r}; valid: {', '.join(NORMALIZERS)}")


Fusion = Union[RRF, ConvexCombination]


def fusion_from_dict(spec: dict) -> Fusion:
    """Build a fusion config from its manifest / API form; errors list the valid methods."""
    spec = dict(spec)
    method = spec.pop("method", None)
    if method == "rrf":
        if "weights" in spec:
            spec["weights"] = tuple(spec["weights"])
        return RRF(**spec)
    if method == "cc":
        return ConvexCombination(**spec)
    raise ValueError(f"unknown fusion method {method!r}; valid: {', '.join(FUSION_METHODS)}")


def fusion_to_dict(fusion: Fusion) -> dict:
    if isinstance(fusion, RRF):
        return {"method": "rrf", "rrf_k": fusion.rrf_k, "weights": list(fusion.weights)}
    return {"method": "cc", "alpha": fusion.alpha, "norm": fusion.norm}


@dataclass(frozen=True)
class Candidates:
    """The union of both retrievers' top-depth lists, each document with both raw scores.

    Arrays are aligned with `doc_idx` (sorted ascending). Ranks count from 1; 0 means the document
    was not in that retriever's top-depth list.
    """

    doc_idx: np.ndarray
    scores: dict[str, np.ndarray]
    ranks: dict[str, np.ndarray]
    floors: dict[str, float]  # theoretical minimum of each retriever's scores (for tmm)

    def __len__(self) -> int:
        return len(self.doc_idx)

    @classmethod
    def from_rankings(cls, rankings: dict[str, Ranking], score_of: dict[str, callable],
                      floors: dict[str, float] | None = None) -> "Candidates":
        """`score_of[name](doc_idx)` returns that retriever's raw scores for any documents."""
        doc_idx = np.unique(np.concatenate([r.doc_idx for r in rankings.values()]))
        ranks = {name: _ranks_in(r, doc_idx) for name, r in rankings.items()}
        scores = {name: np.asarray(score_of[name](doc_idx), dtype=np.float64) for name in rankings}
        return cls(doc_idx, scores, ranks, {**THEORETICAL_MIN, **(floors or {})})


def _ranks_in(ranking: Ranking, doc_idx: np.ndarray) -> np.ndarray:
    ranks = np.zeros(len(doc_idx), dtype=np.int64)
    ranks[np.searchsorted(doc_idx, ranking.doc_idx)] = np.arange(1, len(ranking) + 1)
    return ranks


@dataclass(frozen=True)
class Fused:
    """Fused scores and each retriever's additive contribution, aligned with the candidates."""

    candidates: Candidates
    scores: np.ndarray
    contributions: dict[str, np.ndarray]
    normalized: dict[str, np.ndarray] | None  # cc only

    def ranking(self) -> Ranking:
        order = top_k(self.scores, len(self.scores))  # ties: lower doc_idx first (doc_idx is sorted)
        return Ranking(self.candidates.doc_idx[order.doc_idx], order.scores)


def rrf_contributions(ranks: np.ndarray, rrf_k: float, weight: float) -> np.ndarray:
    """w / (rrf_k + rank) where ranked, 0 where the retriever did not return the document."""
    return np.where(ranks > 0, weight / (rrf_k + np.maximum(ranks, 1)), 0.0)


def fuse(candidates: Candidates, fusion: Fusion) -> Fused:
    if isinstance(fusion, RRF):
        contributions = {
            name: rrf_contributions(candidates.ranks[name], fusion.rrf_k, weight)
            for name, weight in zip(RETRIEVERS, fusion.weights)
        }
        normalized = None
    else:
        normalized = {name: normalize(candidates.scores[name], fusion.norm, candidates.floors[name]) for name in RETRIEVERS}
        contributions = {"dense": fusion.alpha * normalized["dense"], "bm25": (1 - fusion.alpha) * normalized["bm25"]}
    total = contributions["bm25"] + contributions["dense"]
    return Fused(candidates, total, contributions, normalized)
