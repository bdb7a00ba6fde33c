"""Reranking stage: reorder the first stage's top candidates by cross-encoder score."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from search.ranking import Ranking

DEFAULT_RERANK_DEPTH = 50
MAX_RERANK_DEPTH = 200


@dataclass(frozen=True)
class Reranked:
    """The reranked candidates (scores = cross-encoder logits) with where each stood before."""

    ranking: Ranking
    first_stage_rank: np.ndarray  # 1-based rank in the first-stage ranking, aligned with `ranking`
    first_stage_score: np.ndarray


@dataclass(frozen=True)
class RerankOptions:
    """A cross-encoder (models.cross_encoder.CrossEncoder) and how requests use it."""

    model: object
    depth: int = DEFAULT_RERANK_DEPTH  # candidates reranked when a request does not say
    by_default: bool = True  # rerank requests that do not say `rerank`
    name: str = ""

    def __post_init__(self):
        if not 1 <= self.depth <= MAX_RERANK_DEPTH:
            raise ValueError(f"rerank depth must be between 1 and {MAX_RERANK_DEPTH}, got {self.depth}")


class Reranker:
    def __init__(self, options: RerankOptions, text_of: Callable[[int], str]):
        self.options, self.text_of = options, text_of

    def rerank(self, query: str, candidates: Ranking) -> Reranked:
        """All of `candidates` in cross-encoder order; ties keep the first-stage order."""
        texts = [self.text_of(int(i)) for i in candidates.doc_idx]
        scores = self.options.model.score(query, texts)
        order = np.argsort(-scores, kind="stable")
        return Reranked(Ranking(candidates.doc_idx[order], scores[order]), order + 1, candidates.scores[order])
