"""BM25 top-k without scoring every posting: MaxScore dynamic pruning, exact.

A query's score is a sum over its terms' posting lists; a list's entries never exceed its `bound`. MaxScore (Turtle
& Flood, "Query evaluation: strategies and optimizations", IP&M 1995; Lucene's MaxScoreBulkScorer and PISA's
maxscore follow it) splits the lists, by decreasing bound, into essential ones and the rest: once the bounds of the
rest sum to less than theta, a score that k documents are known to reach, a document found in none of the essential
lists cannot enter the top k. So:

  1. theta: the rarest lists (highest bounds, shortest) are read into an accumulator until k documents are seen;
     the k best of them by partial score are scored exactly (looked up in every list), and the lowest of those exact
     scores is theta: k documents reach it. It is refreshed the same way after each further essential list.
  2. essential lists: read whole, until the bounds of the lists left sum to less than theta.
  3. the rest: the candidates (documents of the essential lists) are looked up in each remaining list (binary search
     in its ascending documents), every candidate whose partial score plus the bounds left falls below theta dropped.
  4. the survivors' exact scores, summed in query order with the exhaustive scorer's arithmetic: scores are
     bit-identical to it and ties break the same way (the lower document first: search.ranking).

Frequent terms (low idf, long lists) are the ones step 3 only probes, which is where scoring every posting costs
most. Entries must be non-negative (every BM25 variant but Robertson's idf); theta is compared with a relative margin,
so rounding in partial sums can keep an extra candidate but never drop one that belongs.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from hybrid_retrieval.search.filters.language import Allowed
from hybrid_retrieval.search.ranking import Ranking, top_k

MARGIN = 1e-5  # relative: partial sums (float64, any order) against exact ones (query order, maybe float32)


@dataclass(frozen=True)
class PostingList:
    """One query term's entries in one segment: ascending document numbers, each one's contribution (`values`, times
    `scale` when given: an idf applied lazily, as the exhaustive scorer applies it), and the largest contribution."""

    docs: np.ndarray
    values: np.ndarray
    bound: float
    scale: float | None = None

    def contributions(self, positions: np.ndarray | None = None) -> np.ndarray:
        values = self.values if positions is None else self.values[positions]
        return values if self.scale is None else self.scale * values

    def find(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(which of the ascending `ids` are in this list, their positions in it)."""
        positions = np.searchsorted(self.docs, ids.astype(self.docs.dtype, copy=False))  # same dtype: no copy of docs
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
    """A per-thread accumulator over every document, cleared where a query touched it (allocating and zeroing one per
    query would cost more than reading a rare term's postings)."""

    partial: np.ndarray = np.zeros(0)
    seen: np.ndarray = np.zeros(0, dtype=bool)

    def reserve(self, num_docs: int) -> tuple[np.ndarray, np.ndarray]:
        if len(self.partial) < num_docs:
            self.partial, self.seen = np.zeros(num_docs), np.zeros(num_docs, dtype=bool)
        return self.partial, self.seen


_scratch = _Scratch()


class _Reader:
    """Lists read whole into the accumulator, in the order given: the documents seen (the allowed ones) so far."""

    def __init__(self, lists: list[PostingList], num_docs: int, allowed: Allowed | None):
        self.lists, self.allowed = lists, allowed
        self.partial, self.seen = _scratch.reserve(num_docs)
        self.touched: list[np.ndarray] = []
        self.found: list[np.ndarray] = []
        self.count = 0

    def read(self, posting: PostingList) -> None:
        new = posting.docs[~self.seen[posting.docs]]
        self.seen[new] = True
        self.touched.append(new)
        self.partial[posting.docs] += posting.contributions()
        admitted = new if self.allowed is None else new[self.allowed.mask[new]]
        self.found.append(admitted)
        self.count += len(admitted)

    def candidates(self) -> np.ndarray:
        found = np.concatenate(self.found) if self.found else np.empty(0, dtype=np.int64)
        self.found = [found]
        return found.astype(np.int64, copy=False)

    def theta(self, depth: int, dtype: np.dtype) -> float:
        """The lowest exact score of the `depth` best documents seen by partial score (-inf: fewer seen)."""
        candidates = self.candidates()
        if len(candidates) < depth:
            return -np.inf
        best = candidates[np.argpartition(-self.partial[candidates], depth - 1)[:depth]]
        return float(score_documents(self.lists, np.sort(best), dtype).min())

    def clear(self) -> None:
        for docs in self.touched:
            self.partial[docs], self.seen[docs] = 0.0, False


def top_k_pruned(lists: list[PostingList], depth: int, num_docs: int, dtype: np.dtype, allowed: Allowed | None = None) -> Ranking:
    """The top `depth` documents by the sum of `lists` (among `allowed`), exactly those of exhaustive_scores with
    search.ranking.top_k over the matching (non-zero) ones."""
    order = sorted(range(len(lists)), key=lambda i: -lists[i].bound)
    remaining = np.concatenate([np.cumsum([lists[i].bound for i in order][::-1], dtype=np.float64)[::-1], [0.0]])
    reader = _Reader(lists, num_docs, allowed)
    theta, read = -np.inf, 0
    try:
        while read < len(order) and (reader.count < depth or remaining[read] >= _floor(theta)):
            reader.read(lists[order[read]])
            read += 1
            if reader.count >= depth and read < len(order) and remaining[read] >= _floor(theta):
                theta = max(theta, reader.theta(depth, dtype))
        candidates = np.sort(reader.candidates())
        scores = reader.partial[candidates]
    finally:
        reader.clear()
    for j in range(read, len(order)):  # probe the rest for the candidates still able to reach the top k
        keep = scores + remaining[j] >= _floor(theta)
        candidates, scores = candidates[keep], scores[keep]
        found, positions = lists[order[j]].find(candidates)
        scores[found] += lists[order[j]].contributions(positions)
    candidates = candidates[scores >= _floor(theta)]
    exact = score_documents(lists, candidates, dtype)
    matching = exact != 0  # a document that shares no term with the query (or only zero-weight ones) is no match
    best = top_k(exact[matching], depth)
    return Ranking(candidates[matching][best.doc_idx], best.scores)


def _floor(theta: float) -> float:
    """What a candidate's bound must reach: theta less the margin (-inf before theta is known)."""
    return theta - MARGIN * abs(theta) if np.isfinite(theta) else -np.inf
