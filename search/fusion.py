"""Fusion of rankings from several retrievers.

Reciprocal Rank Fusion (Cormack, Clarke, Buettcher, SIGIR 2009):
    rrf(d) = sum over retrievers o of  w_o / (rrf_k + rank_o(d)),   ranks start at 1.
A document absent from a retriever's list gets nothing from it.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from search.ranking import Ranking, top_k

DEFAULT_RRF_K = 60.0


def rrf(rankings: Sequence[Ranking], rrf_k: float = DEFAULT_RRF_K, weights: Sequence[float] | None = None) -> Ranking:
    """Reciprocal Rank Fusion of `rankings` over the union of their documents, best first."""
    if rrf_k < 0:
        raise ValueError(f"rrf_k must be >= 0, got {rrf_k}")
    weights = [1.0] * len(rankings) if weights is None else list(weights)
    if len(weights) != len(rankings):
        raise ValueError(f"got {len(weights)} weights for {len(rankings)} rankings")
    union = np.unique(np.concatenate([r.doc_idx for r in rankings])) if rankings else np.empty(0, np.int64)
    fused = np.zeros(len(union), dtype=np.float64)
    for ranking, weight in zip(rankings, weights):
        positions = np.searchsorted(union, ranking.doc_idx)
        fused[positions] += weight / (rrf_k + np.arange(1, len(ranking) + 1))
    order = top_k(fused, len(union))  # ties: lower doc_idx first, since union is sorted
    return Ranking(union[order.doc_idx], order.scores)
