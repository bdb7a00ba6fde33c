"""Term-frequency postings: BM25 scored at query time from the statistics of the documents that exist now.

bm25s (search.bm25) precomputes every term-document score with the build's statistics, which is fastest for
a collection that never changes. Once documents are added or deleted, BM25 must use the live collection's
document count, average length and document frequencies (a deleted document must not linger in them, as it
does in Lucene until a merge), so the index also keeps raw term frequencies:

    postings/indptr.npy   int64 (V + 1,)  term t's entries are [indptr[t], indptr[t + 1])
    postings/docs.npy     int32           document of each entry, ascending within a term
    postings/tfs.npy      int32           term frequency of each entry
    postings/lengths.npy  int32 (n,)      analysed length of each document

Term ids are the bm25s vocabulary's. The Lucene variant (bm25s "lucene", the default):
    score(q, d) = sum over query terms t of  idf(t) * tf / (tf + k1 * (1 - b + b * |d| / avgdl)),
    idf(t) = ln(1 + (N - df(t) + 0.5) / (df(t) + 0.5)).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np

POSTINGS_DIR = "postings"
_PARTS = ("indptr", "docs", "tfs", "lengths")


class Postings:
    """Term frequencies of a set of documents, term-major (CSC), and their lengths."""

    def __init__(self, indptr: np.ndarray, docs: np.ndarray, tfs: np.ndarray, lengths: np.ndarray):
        self.indptr, self.docs, self.tfs, self.lengths = indptr, docs, tfs, lengths

    @property
    def num_docs(self) -> int:
        return len(self.lengths)

    @classmethod
    def from_tokens(cls, corpus_tokens: list[list[str]], vocab: dict[str, int]) -> Postings:
        """Postings of analysed documents over `vocab` (term -> id); terms outside it are counted in lengths only."""
        terms, docs, tfs = [], [], []
        lengths = np.zeros(len(corpus_tokens), dtype=np.int32)
        for doc, tokens in enumerate(corpus_tokens):
            lengths[doc] = len(tokens)
            for term, tf in Counter(tokens).items():
                if term in vocab:
                    terms.append(vocab[term])
                    docs.append(doc)
                    tfs.append(tf)
        terms_a = np.asarray(terms, dtype=np.int64)
        order = np.lexsort((np.asarray(docs, dtype=np.int64), terms_a))  # by term, then document
        indptr = np.zeros(len(vocab) + 1, dtype=np.int64)
        np.add.at(indptr, terms_a + 1, 1)
        return cls(np.cumsum(indptr), np.asarray(docs, dtype=np.int32)[order], np.asarray(tfs, dtype=np.int32)[order], lengths)

    def document_frequency(self, alive: np.ndarray | None = None) -> np.ndarray:
        """Per term, how many (alive) documents contain it."""
        if alive is None:
            return np.diff(self.indptr)
        terms = np.repeat(np.arange(len(self.indptr) - 1), np.diff(self.indptr))
        return np.bincount(terms[alive[self.docs]], minlength=len(self.indptr) - 1)

    def term(self, term_id: int) -> tuple[np.ndarray, np.ndarray]:
        start, stop = self.indptr[term_id], self.indptr[term_id + 1]
        return self.docs[start:stop], self.tfs[start:stop]

    def save(self, folder: Path) -> None:
        where = folder / POSTINGS_DIR
        where.mkdir()
        for name in _PARTS:
            np.save(where / f"{name}.npy", getattr(self, name))

    @classmethod
    def load(cls, folder: Path, mmap: bool = True) -> Postings:
        where = folder / POSTINGS_DIR
        # np.asarray: plain arrays over the mapping (np.memmap's per-slice overhead dominates a query's cost)
        return cls(*(np.asarray(np.load(where / f"{name}.npy", mmap_mode="r" if mmap else None)) for name in _PARTS))
