"""A ranking is two aligned arrays, internal document indices and scores, sorted best first."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Ranking:
    doc_idx: np.ndarray  # int64
    scores: np.ndarray  # float32 or float64, same length, descending

    def __len__(self) -> int:
        return len(self.doc_idx)

    def head(self, k: int) -> Ranking:
        return Ranking(self.doc_idx[:k], self.scores[:k])

    @staticmethod
    def empty() -> Ranking:
        return Ranking(np.empty(0, dtype=np.int64), np.empty(0, dtype=np.float32))


def top_k(scores: np.ndarray, k: int, candidates: np.ndarray | None = None) -> Ranking:
    """The k best entries of `scores` (optionally only among `candidates` indices).

    Ties are broken by the lower document index, so results are deterministic.
    """
    doc_idx = np.arange(len(scores), dtype=np.int64) if candidates is None else candidates.astype(np.int64)
    values = scores if candidates is None else scores[candidates]
    if k < len(values):
        # Partition on a slightly larger cut so ties at the boundary are resolved by index below.
        part = np.argpartition(-values, k - 1)[:k]
        threshold = values[part].min()
        part = np.flatnonzero(values >= threshold)
        doc_idx, values = doc_idx[part], values[part]
    order = np.lexsort((doc_idx, -values))[:k]
    return Ranking(doc_idx[order], values[order])
