"""BM25 top-k without scoring every posting: MaxScore dynamic pruning, exact.

A query's score is a sum over its terms' posting lists; a list's entries never exceed its `bound` (the largest
entry). Processed term-at-a-time in decreasing bound order (MaxScore, Turtle & Flood, "Query evaluation: strategies
and optimizations", IP&M 1995; the term-at-a-time form of Lucene's MaxScoreBulkScorer and PISA's maxscore):

  1. essential lists: add each list's entries into an accumulator, until the bounds of the lists not yet read sum
     to less than theta, the k-th best partial score so far. Partial scores only grow, so theta never exceeds the
     final k-th score, and a document in none of the lists read cannot reach the top k.
  2. the rest: look the surviving candidates up in each remaining list (binary search in its ascending document
     numbers), dropping every candidate whose partial score plus the remaining bounds falls below theta.
  3. the survivors' exact scores, summed in query order with the same arithmetic as the exhaustive scorer, so
     scores are bit-identical to it and ties break the same way (the lower document first: search.ranking).

Frequent terms (low idf, long lists) are the ones step 2 only probes, which is where scoring every posting costs
most. Entries must be non-negative (every BM25 variant but Robertson's idf); theta is compared with a relative
margin, so float rounding in partial sums can keep an extra candidate but never drop one that belongs.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from hybrid_retrieval.search.filters.language import Allowed
from hybrid_retrieval.search.ranking import Ranking, top_k

MARGIN = 1e-5  # relative: partial sums (float64, any order) against final ones (query order, maybe float32)


@dataclass(frozen=True)
class PostingList:
    """One query term's entries in one segment: ascending document numbers, each one's contribution
    (`values`, times `scale` when given: an idf applied lazily, so a probed entry costs one multiplication), and an
    upper bound of the contributions."""

    docs: np.ndarray
    values: np.ndarray
    bound: float
    scale: float | None = None

    def contributions(self, positions: np.ndarray | None = None) -> np.ndarray:
        values = self.values if positions is None else self.values[positions]
        return values if self.scale is None else self.scale * values

    def find(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(which of the ascending `ids` are in this list, their positions in it)."""
        positions = np.searchsorted(self.docs, ids)
        found = positions < len(self.docs)
        found[found] = self.docs[positions[found]] == ids[found]
        return found, positions[found]


def exhaustive_scores(lists: list[PostingList], num_docs: int, dtype: np.dtype) -> np.ndarray:
    """Every document's score: the reference the pruned path equals."""
    out = np.zeros(num_docs, dtype=dtype)
    for posting in lists:
        out[posting.docs] += posting.contributions()  # a list holds a document once
    return out


def score_documents(lists: list[PostingList], ids: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """The scores of the ascending documents `ids`, bit-identical to exhaustive_scores's (same order of additions)."""
    out = np.zeros(len(ids), dtype=dtype)
    for posting in lists:
        found, positions = posting.find(ids)
        out[found] += posting.contributions(positions)
    return out


class _Scratch(threading.local):
    """A per-thread accumulator over every document, cleared after each query where it was touched (allocating and
    zeroing one per query would cost as much as scoring a rare term's postings)."""

    partial: np.ndarray = np.zeros(0)
    seen: np.ndarray = np.zeros(0, dtype=bool)

    def reserve(self, num_docs: int) -> tuple[np.ndarray, np.ndarray]:
        if len(self.partial) < num_docs:
            self.partial, self.seen = np.zeros(num_docs), np.zeros(num_docs, dtype=bool)
        return self.partial, self.seen


_scratch = _Scratch()


def top_k_pruned(lists: list[PostingList], depth: int, num_docs: int, dtype: np.dtype, allowed: Allowed | None = None) -> Ranking:
    """The top `depth` documents by the sum of `lists` (among `allowed`), exactly those of exhaustive_scores with
    search.ranking.top_k over the matching (non-zero) ones."""
    order = sorted(range(len(lists)), key=lambda i: -lists[i].bound)
    remaining = np.concatenate([np.cumsum([lists[i].bound for i in order][::-1], dtype=np.float64)[::-1], [0.0]])
    partial, seen = _scratch.reserve(num_docs)
    touched: list[np.ndarray] = []
    try:
        candidates, theta, read = _essential(lists, order, remaining, depth, partial, seen, touched, allowed)
        scores = partial[candidates]
    finally:
        for docs in touched:
            partial[docs], seen[docs] = 0.0, False
    for j in range(read, len(order)):  # probe the rest for the candidates still able to reach the top k
        keep = scores + remaining[j] >= theta - MARGIN * abs(theta)
        candidates, scores = candidates[keep], scores[keep]
        found, positions = lists[order[j]].find(candidates)
        scores[found] += lists[order[j]].contributions(positions)
        theta = max(theta, _kth(scores, depth))
    candidates = candidates[scores + MARGIN * abs(theta) >= theta]
    exact = score_documents(lists, candidates, dtype)
    matching = exact != 0  # a document that shares no term with the query (or only zero-weight ones) is no match
    best = top_k(exact[matching], depth)
    return Ranking(candidates[matching][best.doc_idx], best.scores)


def _essential(
    lists: list[PostingList],
    order: list[int],
    remaining: np.ndarray,
    depth: int,
    partial: np.ndarray,
    seen: np.ndarray,
    touched: list[np.ndarray],
    allowed: Allowed | None,
) -> tuple[np.ndarray, float, int]:
    """Read lists in `order` into `partial` until the unread ones cannot lift a new document into the top `depth`:
    (the allowed documents seen, ascending; theta; how many lists were read)."""
    found: list[np.ndarray] = []
    theta, read = -np.inf, 0
    while read < len(order):
        posting = lists[order[read]]
        new = posting.docs[~seen[posting.docs]]
        seen[new] = True
        touched.append(new)
        partial[posting.docs] += posting.contributions()
        found.append(new if allowed is None else new[allowed.mask[new]])
        read += 1
        if read == len(order):
            break
        candidates = np.concatenate(found)
        found = [candidates]
        theta = max(theta, _kth(partial[candidates], depth))
        if remaining[read] < theta - MARGIN * abs(theta):
            break
    candidates = np.sort(np.concatenate(found)) if found else np.empty(0, dtype=np.int64)
    return candidates.astype(np.int64, copy=False), theta, read


def _kth(scores: np.ndarray, k: int) -> float:
    """The k-th largest score (-inf when there are fewer)."""
    if len(scores) < k:
        return -np.inf
    return float(np.partition(scores, len(scores) - k)[len(scores) - k])
