"""BM25 retrieval.

`BM25Index` is the serving engine: bm25s precomputes every term-document score into sparse
CSC arrays, so a query is a sum of a few columns (memory-mappable `.npy` files on disk). Its top-k sums those
columns and keeps the best in one pass (compiled: search.maxscore); in large collections it prunes them by window
bounds instead (`worth_pruning`).
`ReferenceBM25` wraps rank-bm25, kept as the reference implementation for tests and benchmarks.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
import warnings
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hybrid_retrieval.common.errors import ConfigError
from hybrid_retrieval.search import maxscore
from hybrid_retrieval.search.analyzer import Analyzer, AnalyzerError
from hybrid_retrieval.search.filters.language import Allowed
from hybrid_retrieval.search.maxscore import (
    PostingList,
    ScoreOf,
    WindowBounds,
    WindowPool,
    exhaustive_leg,
    exhaustive_scores,
    score_documents,
    top_k_pruned,
    top_matches,
)
from hybrid_retrieval.search.postings import Postings
from hybrid_retrieval.search.ranking import Ranking
from hybrid_retrieval.search.typo import VARIANT_WEIGHTS, Lexicon, Variants
from hybrid_retrieval.search.typo import variants as typo_variants
from hybrid_retrieval.search.typo import warm as warm_typo_kernel

logger = logging.getLogger(__name__)

ANALYZER_FILE = "analyzer.json"
BM25_METHODS = ("lucene", "robertson", "atire", "bm25l", "bm25+")
# Block-max pruning (search.maxscore) against summing every posting with the compiled kernels, 1,300 queries on the
# generated haystack (docs/BENCHMARKS.md, "BM25 at scale"): the top 10 of 100,000 documents 1.36 times slower at p50,
# of 300,000 even, of a million 0.41 times; the top 100 of a million 1.45 times slower. So it is used from 30,000
# documents a result asked for. A 1% filter leaves it few documents to raise its threshold with (2.2 times slower at
# 1M), so a filter must admit a quarter of the documents: a cautious cut, not a measured crossover
PRUNE_DOCS_PER_RESULT = 30_000
PRUNE_ADMITTED = 0.25
TERM_CACHE = 65_536  # terms whose largest score a BM25 index keeps (search.maxscore)
# the window bounds of the terms searched since the pool last filled (3 bytes a window of 64 documents a term: 47 KB at
# a million documents): the 3,000 terms of the 1,300 benchmark queries at a million documents fit
WINDOW_CACHE_BYTES = 144 << 20


@dataclass(frozen=True)
class BM25Params:
    method: str = "lucene"
    k1: float = 1.5
    b: float = 0.75
    delta: float = 0.5  # used by bm25l and bm25+ only

    def __post_init__(self) -> None:
        if self.method not in BM25_METHODS:
            raise ConfigError(f"unknown BM25 method {self.method!r}; valid: {', '.join(BM25_METHODS)}")
        if self.k1 < 0 or not 0 <= self.b <= 1:
            raise ConfigError(f"BM25 needs k1 >= 0 and 0 <= b <= 1, got k1={self.k1}, b={self.b}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def worth_pruning(num_docs: int, depth: int, allowed: Allowed | None) -> bool:
    """Whether block-max pruning is expected to beat summing every posting for a top-`depth` among `allowed` (None: all)."""
    return num_docs >= PRUNE_DOCS_PER_RESULT * depth and (allowed is None or allowed.fraction >= PRUNE_ADMITTED)


class BM25Index:
    """Sparse precomputed BM25 scores over analysed documents."""

    def __init__(self, engine: Any, analyzer: Analyzer) -> None:  # engine: a bm25s.BM25 (untyped)
        # plain arrays over a mapping: np.memmap's per-slice overhead showed in a loaded service's profile
        engine.scores = {name: np.asarray(v) if isinstance(v, np.ndarray) else v for name, v in engine.scores.items()}
        self._engine = engine
        self.analyzer = analyzer
        self._vocab: dict[str, int] = engine.vocab_dict
        self.num_docs = int(engine.scores["num_docs"])
        # pruning needs entries >= 0 and no score outside the lists: not Robertson's idf (negative for common
        # terms), nor bm25l/bm25+, which give every document a non-occurrence score
        self.prunable = engine.method != "robertson" and engine.nonoccurrence_array is None
        # over the arrays, not a method of self: a cache of a bound method is a cycle, freed only by a full collection
        self._bound = functools.lru_cache(maxsize=TERM_CACHE)(functools.partial(_largest_score, engine.scores))
        self._windows: dict[int, WindowBounds] = {}  # term id -> its rows in self._pool
        self._pool: WindowPool | None = None
        self._pool_lock = threading.Lock()

    @classmethod
    def build(cls, corpus_tokens: Iterable[list[str]], analyzer: Analyzer, params: BM25Params) -> BM25Index:
        """Over analysed documents (term ids in sorted term order: the same files from every build of a corpus)."""
        postings, vocabulary = Postings.from_tokens(corpus_tokens)
        return cls.from_postings(postings, vocabulary, analyzer, params)

    @classmethod
    def from_postings(cls, postings: Postings, vocabulary: dict[str, int], analyzer: Analyzer, params: BM25Params) -> BM25Index:
        """The score matrix of the documents `postings` holds, vectorised over every entry: the arrays bm25s's own
        indexing computes document by document (its formulas, dtypes and order of operations; tests compare the files
        byte for byte), without the Python objects a term of a document costs there."""
        import bm25s
        from bm25s import scoring

        engine = bm25s.BM25(method=params.method, k1=params.k1, b=params.b, delta=params.delta)
        n, df = postings.num_docs, np.diff(postings.indptr)
        if len(df) > 1 and vocabulary.get("") == len(df) - 1 and df[-1] == 0:
            df = df[:-1]  # the "" bm25s adds after the corpus's terms has no column (it has one when it is alone)
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore", RuntimeWarning)  # an empty collection averages nothing
            avgdl = np.asarray(postings.lengths, dtype=np.int64).mean()
        idf_of = scoring._select_idf_scorer(engine.idf_method)
        counts, of_term = np.unique(df, return_inverse=True)  # one idf a distinct document frequency
        idf = np.asarray([idf_of(int(c), N=n) if c else 0.0 for c in counts], dtype=engine.dtype)[of_term]
        nonoccurrence = None
        if params.method in engine.methods_requiring_nonoccurrence:
            frequencies = {term: int(count) for term, count in enumerate(df)}
            tfc_of = scoring._select_tfc_scorer(params.method)
            nonoccurrence = scoring._build_nonoccurrence_array(
                frequencies, n, idf_of, tfc_of, avgdl, avgdl, params.k1, params.b, params.delta, engine.dtype
            )
        terms = postings.entry_terms()
        tfc = scoring._select_tfc_scorer(params.method)(
            tf_array=postings.tfs.astype(engine.dtype),
            l_d=postings.lengths[postings.docs].astype(np.int64),
            l_avg=avgdl,
            k1=params.k1,
            b=params.b,
            delta=params.delta,
        )
        data = idf[terms] * tfc
        if nonoccurrence is not None:
            data -= nonoccurrence[terms]
        engine.scores = {
            "data": data.astype(engine.dtype),
            "indices": postings.docs.astype(engine.int_dtype),
            "indptr": postings.indptr[: len(df) + 1].astype(np.int64),
            "num_docs": n,
        }
        engine.nonoccurrence_array = nonoccurrence
        engine.vocab_dict = dict(vocabulary)
        engine.unique_token_ids_set = set(engine.vocab_dict.values())
        return cls(engine, analyzer)

    def save(self, folder: Path) -> None:
        self._engine.save(str(folder), show_progress=False)
        # the analyzer that made these terms, beside them: a manifest that names another one is refused at load
        (folder / ANALYZER_FILE).write_text(json.dumps(self.analyzer.to_dict(), ensure_ascii=False, sort_keys=True))

    @classmethod
    def load(cls, folder: Path, analyzer: Analyzer, mmap: bool = True) -> BM25Index:
        import bm25s

        made_by = folder / ANALYZER_FILE
        if made_by.is_file() and (built := Analyzer.from_dict(json.loads(made_by.read_text()))) != analyzer:
            changed = sorted(k for k, v in built.to_dict().items() if analyzer.to_dict().get(k) != v)
            raise AnalyzerError(
                f"{folder}: its terms were made by another analyzer than the manifest names (differs in {', '.join(changed)}); "
                "queries would not match them: rebuild the index with the analyzer you want"
            )
        index = cls(bm25s.BM25.load(str(folder), mmap=mmap, show_progress=False), analyzer)
        maxscore.warm(pruning=index.prunable and worth_pruning(index.num_docs, 1, None))  # at open: no search waits
        warm_typo_kernel()
        return index

    @property
    def engine(self) -> Any:
        """The bm25s engine (its score matrix is replaced for a shard's corpus-wide statistics: indexer.shards)."""
        return self._engine

    @property
    def vocabulary_size(self) -> int:
        return len(self._vocab)

    @property
    def vocabulary(self) -> dict[str, int]:
        """Term -> id, the ids of the score matrix (and of search.postings)."""
        return self._vocab

    def query_token_ids(self, query: str) -> list[int]:
        """Analysed query terms that exist in the index (repeated terms count again, as in Lucene)."""
        return [self._vocab[t] for t in self.analyzer.query_terms(query) if t in self._vocab]

    @functools.cached_property
    def lexicon(self) -> Lexicon:
        """The index's terms searchable by edit distance (search.typo): built at the first query that needs it."""
        return Lexicon(t for t in self._vocab if t)

    def variants(self, query: str, typo: str | int) -> dict[str, list[tuple[str, int]]]:
        """The typo variants (term, edits) each query term the index does not hold is matched to (search.typo)."""
        return typo_variants(self.analyzer, query, typo, self._vocab.__contains__, self.near, self.df)

    def near(self, term: str, edits: int) -> list[tuple[str, int]]:
        """The index's terms within `edits` edits of `term` (but itself), with their distances (search.typo)."""
        return [(self.lexicon.terms[at], distance) for at, distance in self.lexicon.near(term, edits)]

    def df(self, term: str) -> int:
        """Documents that hold `term` (which the index must hold)."""
        indptr, term_id = self._engine.scores["indptr"], self._vocab[term]
        return int(indptr[term_id + 1] - indptr[term_id])

    def _weighted_terms(self, query: str, typo: str | int | Variants) -> list[list[tuple[int, float]]]:
        """Per query term, in query order: [(its id, 1.0)] if the index holds it, else its typo variants' (id, weight)
        (`typo` the variants themselves: a shard's, which its coordinator chose for the whole index; those this shard
        holds)."""
        # bm25l and bm25+ score every document for every term (non-occurrence): a best-of-variants would need its own
        # non-occurrence, so they match terms exactly
        terms = self.analyzer.query_terms(query)
        if isinstance(typo, dict):
            variants = typo
        else:
            unheld = any(term not in self._vocab for term in terms)
            variants = self.variants(query, typo) if typo != 0 and unheld and self._engine.nonoccurrence_array is None else {}
        out = []
        for term in terms:
            if term in self._vocab:
                out.append([(self._vocab[term], 1.0)])
            elif held := [(self._vocab[v], VARIANT_WEIGHTS[d]) for v, d in variants.get(term, ()) if v in self._vocab]:
                out.append(held)
        return out

    def scores(self, query: str, typo: str | int | Variants = 0) -> np.ndarray:
        """BM25 score of every document for `query` (zeros when no term matches), with typo tolerance `typo`."""
        terms = self._weighted_terms(query, typo)
        if not terms:
            return np.zeros(self.num_docs, dtype=np.float32)
        scores = exhaustive_scores(self._columns(terms), self.num_docs, np.dtype(self._engine.dtype))
        if self._engine.nonoccurrence_array is not None:  # bm25l and bm25+ score a document without the term too
            scores += self._engine.nonoccurrence_array[[alternatives[0][0] for alternatives in terms]].sum()
        return scores

    def _columns(self, terms: list[list[tuple[int, float]]], bounded: bool = False) -> list[PostingList]:
        """The terms' columns of the score matrix, in query order, a term's typo variants a group (with each one's
        largest entry and window bounds when `bounded`: what pruning needs, read once a term and kept)."""
        data, indices, indptr = (self._engine.scores[name] for name in ("data", "indices", "indptr"))
        matrix = (indices, data)  # what every column is a slice of: the lists go to the kernels without a copy
        lists = []
        for position, alternatives in enumerate(terms):
            group = position if len(alternatives) > 1 else None
            for term_id, weight in alternatives:
                start, stop = indptr[term_id], indptr[term_id + 1]
                bound = weight * self._bound(term_id) if bounded else np.inf
                windows = self._window_bounds(term_id) if bounded and group is None else None
                scale = None if weight == 1.0 else weight
                column = (indices[start:stop], data[start:stop])
                lists.append(PostingList(*column, bound, scale, within=matrix, start=int(start), group=group, windows=windows))
        return lists

    def _window_bounds(self, term_id: int) -> WindowBounds:
        """A term's column by window (search.maxscore), kept in a pool of WINDOW_CACHE_BYTES: a full pool is replaced
        by an empty one, so the terms searched since fill it (the old one lives while a search reads it)."""
        if (found := self._windows.get(term_id)) is not None and found.pool is self._pool:
            return found
        matrix = self._engine.scores
        start, stop = matrix["indptr"][term_id], matrix["indptr"][term_id + 1]
        with self._pool_lock:
            if (found := self._windows.get(term_id)) is not None and found.pool is self._pool:  # added meanwhile
                return found
            if self._pool is None or self._pool.full:
                row_bytes = 3 * ((self.num_docs >> maxscore.WINDOW_SHIFT) + 1)
                self._pool, self._windows = WindowPool(self.num_docs, max(64, WINDOW_CACHE_BYTES // row_bytes)), {}
            self._windows[term_id] = found = self._pool.add(matrix["indices"][start:stop], matrix["data"][start:stop])
        return found

    def posting_lists(self, query: str, typo: str | int | Variants = 0) -> list[PostingList]:
        """The query terms' columns of the score matrix, in query order, with their bounds."""
        return self._columns(self._weighted_terms(query, typo), bounded=True)

    def leg(
        self, query: str, depth: int, allowed: Allowed | None = None, prune: bool | None = None, typo: str | int | Variants = 0
    ) -> tuple[Ranking, ScoreOf]:
        """(the top `depth` documents that match a query term and the filter, the query's score of any documents).
        `prune`: by block-max pruning (search.maxscore) or every posting summed; None: as `worth_pruning` says. `typo`: the
        typo tolerance (search.typo)."""
        if not self.prunable or not (worth_pruning(self.num_docs, depth, allowed) if prune is None else prune):
            return exhaustive_leg(self.scores(query, typo), depth, allowed)
        lists, dtype = self.posting_lists(query, typo), np.dtype(self._engine.dtype)
        return top_k_pruned(lists, depth, self.num_docs, dtype, allowed), lambda ids: score_documents(lists, ids, dtype)

    def search(self, query: str, depth: int, allowed: Allowed | None = None) -> Ranking:
        """Top-`depth` documents that match at least one query term (and the filter, if any)."""
        return self.leg(query, depth, allowed)[0]

    ranking_from_scores = staticmethod(top_matches)  # a document that shares no term with the query scores 0: no match


class ReferenceBM25:
    """rank-bm25's BM25Okapi over the same analyzer: slow, simple, independent."""

    def __init__(self, corpus_tokens: Iterable[list[str]], analyzer: Analyzer, params: BM25Params):
        from rank_bm25 import BM25Okapi

        self.analyzer = analyzer
        self._engine = BM25Okapi(list(corpus_tokens), k1=params.k1, b=params.b)

    def scores(self, query: str) -> np.ndarray:
        return np.asarray(self._engine.get_scores(self.analyzer.analyze(query)), dtype=np.float64)

    def search(self, query: str, depth: int) -> Ranking:
        return BM25Index.ranking_from_scores(self.scores(query), depth)


def _largest_score(matrix: dict[str, Any], term_id: int) -> float:
    """A term's largest entry in a bm25s score matrix."""
    indptr = matrix["indptr"]
    return float(matrix["data"][indptr[term_id] : indptr[term_id + 1]].max(initial=0.0))
