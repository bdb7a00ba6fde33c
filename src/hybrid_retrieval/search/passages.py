"""A document's score from its passages' scores.

max    the best passage's score (MaxP): a document is as relevant as its most relevant part
soft   τ · log Σ exp(s_i / τ) over its `top` best passages: the best passage, plus a bonus of at most τ · log(top)
       for other passages that score nearly as well (τ → 0 is max)
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from hybrid_retrieval.search.dense import FaissParams, exact_top_k
from hybrid_retrieval.search.filters.language import Allowed
from hybrid_retrieval.search.ranking import Ranking, top_k
from hybrid_retrieval.search.spec import PassageSpec


def aggregate(scores: np.ndarray, rows: np.ndarray, scoring: PassageSpec) -> tuple[np.ndarray, np.ndarray]:
    """(the distinct documents `rows` names, ascending; each one's score from its passages' `scores`)."""
    if not len(rows):
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.float32)
    order = np.lexsort((-scores, rows))  # by document, best passage first
    rows, scores = rows[order], np.asarray(scores[order], dtype=np.float64)
    firsts = np.flatnonzero(np.r_[True, rows[1:] != rows[:-1]])
    best = scores[firsts]
    if scoring.aggregation == "max":
        return rows[firsts], best.astype(np.float32)
    group = np.repeat(np.arange(len(firsts)), np.diff(np.r_[firsts, len(rows)]))
    rank = np.arange(len(rows)) - firsts[group]
    kept = rank < scoring.top
    weights = np.exp((scores[kept] - best[group[kept]]) / scoring.temperature)
    total = np.bincount(group[kept], weights=weights, minlength=len(firsts))
    return rows[firsts], (best + scoring.temperature * np.log(total)).astype(np.float32)


class VectorSearch(Protocol):
    """What finds passages: a DenseIndex, or search.segments.LiveDense after writes."""

    dimension: int
    params: FaissParams

    def search(self, query: np.ndarray, depth: int, allowed: Allowed | None = None) -> Ranking: ...

    def brute_force(self, allowed: Allowed) -> bool: ...


class Rows(Protocol):
    """`rows[ids]` of an array, or of search.segments.LiveVectors across the base's and the written documents'."""

    def __getitem__(self, ids: Any) -> np.ndarray: ...

    def __matmul__(self, vector: np.ndarray) -> np.ndarray: ...


class PassageIndex:
    """The passages of an index's documents: each one's document (`rows`, ascending: a document's passages are
    consecutive), its character span in the document's text, its unit vector, and a vector index over them. It ranks
    documents: on an exact (flat) index by scoring every passage, on an approximate one by scoring the documents of
    the best passages it finds from all of their passages.
    """

    def __init__(self, dense: VectorSearch, vectors: Rows, rows: np.ndarray, spans: Rows, num_docs: int, lexical: Any = None):
        """`lexical`: a search.segments.PassageBM25 over the passages (None: the index's BM25 method keeps no live
        statistics)."""
        self.dense, self.vectors, self.rows, self.spans, self.lexical = dense, vectors, rows, spans, lexical
        self.num_docs = num_docs
        self.first = np.searchsorted(rows, np.arange(num_docs + 1))  # the passages of document i: first[i]:first[i + 1]
        self.dimension = dense.dimension
        self.exact = dense.params.built_for(len(rows)).kind == "flat"

    def __len__(self) -> int:
        return len(self.rows)

    def passages_of(self, doc_idx: np.ndarray) -> np.ndarray:
        """Every passage of these documents."""
        starts, stops = self.first[doc_idx], self.first[np.asarray(doc_idx) + 1]
        counts = stops - starts
        return np.repeat(starts - np.r_[0, np.cumsum(counts)[:-1]], counts) + np.arange(counts.sum())

    def nearest(self, doc_idx: int, vector: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
        """(the document's `count` passages nearest the query, best first; their cosines)."""
        ids = self.passages_of(np.array([doc_idx]))
        best = top_k(self.vectors[ids] @ vector, count)
        return ids[best.doc_idx], best.scores

    def best(self, doc_idx: int, vector: np.ndarray) -> tuple[int, int]:
        """The span of the document's passage nearest the query."""
        start, end = self.spans[self.nearest(doc_idx, vector, 1)[0][0]]
        return int(start), int(end)

    def scores(self, doc_idx: np.ndarray, vector: np.ndarray, scoring: PassageSpec) -> np.ndarray:
        """Each document's score from all of its passages (0 for a document without passages: an empty text)."""
        doc_idx = np.asarray(doc_idx, dtype=np.int64)
        passages = self.passages_of(doc_idx)
        docs, scores = aggregate(self.vectors[passages] @ vector, self.rows[passages], scoring)
        out = np.zeros(len(doc_idx), dtype=np.float32)
        found = np.isin(doc_idx, docs)
        out[found] = scores[np.searchsorted(docs, doc_idx[found])]
        return out

    def search(self, vector: np.ndarray, depth: int, scoring: PassageSpec, allowed: Allowed | None = None) -> Ranking:
        """The top-`depth` documents (of the allowed ones). On an exact (flat) index every passage is scored at once;
        on an approximate one, passages are fetched until `depth` distinct documents are among them (or none are
        left), and those documents scored from all their passages."""
        if self.exact:
            return self._exact(vector, depth, scoring, allowed)
        passages_allowed = None if allowed is None else Allowed(allowed.mask[self.rows])
        available = len(self) if passages_allowed is None else passages_allowed.count
        fetch = depth
        while True:
            if passages_allowed is not None and self.dense.brute_force(passages_allowed):
                found = exact_top_k(lambda ids: self.vectors[ids] @ vector, passages_allowed.ids, fetch)
            else:
                found = self.dense.search(vector, fetch, passages_allowed)
            docs = np.unique(self.rows[found.doc_idx])
            if len(docs) >= depth or fetch >= available:
                break
            fetch = min(available, fetch * 4)
        best = top_k(self.scores(docs, vector, scoring), depth)  # ties: the lower document first, as everywhere
        return Ranking(docs[best.doc_idx], best.scores)

    def _exact(self, vector: np.ndarray, depth: int, scoring: PassageSpec, allowed: Allowed | None) -> Ranking:
        scores = self.vectors @ vector
        if scoring.aggregation == "max":  # a document's passages are consecutive: one reduction over all of them
            docs = np.flatnonzero(np.diff(self.first))
            doc_scores = np.maximum.reduceat(scores, self.first[docs]) if len(docs) else scores[:0]
        else:
            docs, doc_scores = aggregate(scores, self.rows, scoring)
        if allowed is not None:
            keep = allowed.mask[docs]
            docs, doc_scores = docs[keep], doc_scores[keep]
        best = top_k(doc_scores, depth)
        return Ranking(docs[best.doc_idx], best.scores)
