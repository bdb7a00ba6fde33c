"""Reranking stage: reorder the first stage's top candidates by cross-encoder score, optionally
interpolated with the first-stage score."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from search.normalize import zscore
from search.ranking import Ranking

DEFAULT_RERANK_DEPTH = 50
MAX_RERANK_DEPTH = 200


def check_weight(weight: float) -> float:
    """The interpolation weight, or ValueError: it must be a number in [0, 1] (NaN is not)."""
    if not 0.0 <= weight <= 1.0:
        raise ValueError(f"must be between 0 and 1, got {weight}")
    return weight


def interpolate(rerank_scores: np.ndarray, first_stage_scores: np.ndarray, weight: float) -> np.ndarray:
    """Final scores of one query's reranked candidates.

    weight 1: the cross-encoder logits (plain reranking). Otherwise
    weight * z(logits) + (1 - weight) * z(first-stage scores), z-scores over this query's candidates
    because logits and fused scores live on unrelated scales. A cross-encoder weaker than the first
    stage on some queries then corrects it instead of replacing it (Wang et al., "BERT-based Dense
    Retrievers Require Interpolation with BM25", ICTIR 2021); the weight is tuned on held-out queries.
    """
    if check_weight(weight) == 1.0:
        return np.asarray(rerank_scores, dtype=np.float32)
    if weight == 0.0:  # the first stage alone: a NaN logit must not leak in through 0 * NaN
        return zscore(np.asarray(first_stage_scores, np.float64)).astype(np.float32)
    mixed = weight * zscore(np.asarray(rerank_scores, np.float64)) + (1 - weight) * zscore(np.asarray(first_stage_scores, np.float64))
    return mixed.astype(np.float32)


@dataclass(frozen=True)
class Reranked:
    """The reranked candidates (scores = final scores) with the cross-encoder logit and where each stood before."""

    ranking: Ranking
    rerank_score: np.ndarray  # cross-encoder logit, aligned with `ranking`
    first_stage_rank: np.ndarray  # 1-based rank in the first-stage ranking
    first_stage_score: np.ndarray
    weight: float


@dataclass(frozen=True)
class RerankOptions:
    """A cross-encoder (models.cross_encoder.CrossEncoder) and how requests use it."""

    model: object
    depth: int = DEFAULT_RERANK_DEPTH  # candidates reranked when a request does not say
    by_default: bool = True  # rerank requests that do not say `rerank`
    name: str = ""
    weight: float = 1.0  # interpolation weight of the cross-encoder (see `interpolate`) when a request does not say

    def __post_init__(self):
        if not 1 <= self.depth <= MAX_RERANK_DEPTH:
            raise ValueError(f"rerank depth must be between 1 and {MAX_RERANK_DEPTH}, got {self.depth}")
        try:
            check_weight(self.weight)
        except ValueError as exc:
            raise ValueError(f"rerank weight {exc}") from None


class Reranker:
    def __init__(self, options: RerankOptions, text_of: Callable[[int], str]):
        self.options, self.text_of = options, text_of

    def rerank(self, query: str, candidates: Ranking, weight: float | None = None) -> Reranked:
        """All of `candidates` ordered by final score; ties keep the first-stage order."""
        weight = self.options.weight if weight is None else weight
        texts = [self.text_of(int(i)) for i in candidates.doc_idx]
        logits = np.asarray(self.options.model.score(query, texts), dtype=np.float32)
        final = interpolate(logits, candidates.scores, weight)
        order = np.argsort(-final, kind="stable")
        return Reranked(Ranking(candidates.doc_idx[order], final[order]), logits[order], order + 1,
                        candidates.scores[order], weight)
