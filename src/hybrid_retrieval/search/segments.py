"""A collection that changed since its build: the base segment, live documents added since, deletions.

Documents are numbered base first (0 .. n-1, the built index's order) then live (n .. n+m-1). Every piece here
presents the interface the search pipeline already uses (search.pipeline), over that joint numbering:

    LiveBM25      scores(query) with the statistics of the documents that exist now (search.postings)
    LiveDense     the base FAISS index (deleted documents excluded by the caller's allowed set) + live vectors
    LiveVectors   embeddings[ids] across both segments
    concat_columns   metadata columns of both segments as one (search.filters), so filters apply to new documents

Deleted base documents are excluded by an alive mask that the pipeline intersects with any filter.
"""

from __future__ import annotations

import functools
import threading
from collections import Counter, OrderedDict
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from hybrid_retrieval.common.errors import ConfigError
from hybrid_retrieval.search.bm25 import BM25Index, BM25Params
from hybrid_retrieval.search.dense import DenseIndex
from hybrid_retrieval.search.fields import FieldWeights, length_norms, saturated
from hybrid_retrieval.search.filters.columns import KeywordColumn, MetadataCollector, MetadataColumns, ValueColumn
from hybrid_retrieval.search.filters.language import Allowed
from hybrid_retrieval.search.filters.types import FieldInfo
from hybrid_retrieval.search.live_terms import TermCounts, coded, term_counts
from hybrid_retrieval.search.maxscore import PostingList, ScoreOf, exhaustive_leg, exhaustive_scores, score_documents, top_k_pruned
from hybrid_retrieval.search.passages import PassageIndex, aggregate
from hybrid_retrieval.search.postings import Postings
from hybrid_retrieval.search.ranking import Ranking, top_k
from hybrid_retrieval.search.spec import PassageSpec
from hybrid_retrieval.search.typo import VARIANT_WEIGHTS, Lexicon, TypoTerms, Variants
from hybrid_retrieval.search.typo import variants as typo_variants


@dataclass(frozen=True)
class LiveDocument:
    """A document written through the API: stored fields, analysed terms, its embedding."""

    doc_id: str
    title: str
    text: str
    metadata: dict[str, Any]
    term_ids: np.ndarray  # int32: its distinct analysed terms, as ids of the collection's live vocabulary, ascending
    tfs: np.ndarray  # their frequencies, in the narrowest unsigned type (search.postings.narrowest)
    length: int  # analysed tokens
    vector: np.ndarray  # unit vector from the index's embedder
    position: int = -1  # in a shard: the document's position in the whole sharded index (indexer.shards)
    passage_spans: np.ndarray | None = None  # a chunked index: (m, 2) character spans of the document's passages
    passage_vectors: np.ndarray | None = None  # and their (m, dimension) unit vectors
    title_tfs: np.ndarray | None = None  # how many of each term's occurrences are in the title (search.fields), narrowest
    title_length: int = 0  # the title's analysed tokens

    @classmethod
    def analysed(  # noqa: PLR0913
        cls,
        doc_id: str,
        title: str,
        text: str,
        metadata: dict[str, Any],
        tokens: list[str],
        vector: np.ndarray,
        vocabulary: dict[str, int],
        position: int = -1,
        passages: tuple[np.ndarray, np.ndarray] | None = None,
        title_tokens: list[str] | None = None,
    ) -> LiveDocument:
        """A document of analysed terms `tokens`; `vocabulary` (term -> id, append-only, shared by the collection's live
        documents) gains its new terms; `title_tokens`: the title's (the first of `tokens`), for scoring by field. A
        write batch is analysed at once instead (search.live_terms.TermCoder, then `of`)."""
        ids, title_ids = coded(tokens, vocabulary), coded(title_tokens or [], vocabulary)
        (counts,) = term_counts(ids, np.array([len(ids)]), title_ids, np.array([len(title_ids)]))
        return cls.of(doc_id, title, text, metadata, counts, vector, position, passages)

    @classmethod
    def of(
        cls,
        doc_id: str,
        title: str,
        text: str,
        metadata: dict[str, Any],
        counts: TermCounts,
        vector: np.ndarray,
        position: int = -1,
        passages: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> LiveDocument:
        return cls(
            doc_id,
            title,
            text,
            metadata,
            counts.term_ids,
            counts.tfs,
            counts.length,
            np.asarray(vector, dtype=np.float32),
            position,
            passage_spans=passages[0] if passages else None,
            passage_vectors=passages[1] if passages else None,
            title_tfs=counts.title_tfs,
            title_length=counts.title_length,
        )


_NO_POSTINGS = (np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64))
_NO_FIELD_POSTINGS = (*_NO_POSTINGS, np.empty(0, dtype=np.int64))
WEIGHT_CACHE_BYTES = 128 * 2**20  # base weights a snapshot keeps (in bytes: a frequent term's are megabytes)


_ColumnsKey = tuple[tuple[tuple[str, str | None], ...], tuple[str, ...]]  # field types, the base's fields


class _Rows:
    """Rows appended to a buffer that grows by doubling: a segment reads its first `n` rows, which never change, so a
    segment extended from it shares the buffer instead of copying every row at each refresh."""

    def __init__(self, rows: np.ndarray):
        self.buffer, self.length = rows, len(rows)

    def append(self, rows: np.ndarray) -> np.ndarray:
        """`rows` after the ones so far; all of them (a view of the buffer)."""
        end = self.length + len(rows)
        if end > len(self.buffer):
            grown = np.empty((max(end, 2 * len(self.buffer), 64), *self.buffer.shape[1:]), dtype=self.buffer.dtype)
            grown[: self.length] = self.buffer[: self.length]
            self.buffer = grown  # the segments that read the old buffer keep it
        self.buffer[self.length : end] = rows
        self.length = end
        return self.buffer[:end]


@dataclass(frozen=True)
class _TermChunk:
    """The postings of documents [first, first + count) of a segment, by term id (CSC: indptr over the vocabulary
    as it was when the chunk was made; later terms have no entries here)."""

    first: int
    count: int
    indptr: np.ndarray
    docs: np.ndarray  # segment positions
    tfs: np.ndarray
    title_tfs: np.ndarray  # the title's share of each frequency

    @classmethod
    def of(cls, docs: list[LiveDocument], first: int, vocabulary_size: int) -> _TermChunk:
        term_ids = np.concatenate([d.term_ids for d in docs]) if docs else np.empty(0, np.int64)
        tfs = np.concatenate([d.tfs for d in docs]) if docs else np.empty(0, np.int64)
        in_title = np.concatenate([title_tfs(d) for d in docs]) if docs else np.empty(0, np.int64)
        doc_of = np.repeat(np.arange(first, first + len(docs), dtype=np.int32), [len(d.term_ids) for d in docs])
        order = np.argsort(term_ids, kind="stable")  # by term, then document
        indptr = np.concatenate([[0], np.cumsum(np.bincount(term_ids, minlength=vocabulary_size))])
        return cls(first, len(docs), indptr, doc_of[order], tfs[order], in_title[order])

    def merged(self, after: _TermChunk) -> _TermChunk:
        """This chunk and the one of the documents right after it, as one."""
        terms = max(len(self.indptr), len(after.indptr)) - 1
        term_ids = np.concatenate([_term_of_entries(self.indptr), _term_of_entries(after.indptr)])
        order = np.argsort(term_ids, kind="stable")  # two sorted runs: merged in linear time; by term, then document
        indptr = np.concatenate([[0], np.cumsum(np.bincount(term_ids, minlength=terms))])
        docs, tfs = np.concatenate([self.docs, after.docs])[order], np.concatenate([self.tfs, after.tfs])[order]
        title_tfs = np.concatenate([self.title_tfs, after.title_tfs])[order]
        return _TermChunk(self.first, self.count + after.count, indptr, docs, tfs, title_tfs)

    def postings(self, term_id: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(documents, frequencies, the title's share of each)."""
        if term_id + 1 >= len(self.indptr):
            return _NO_FIELD_POSTINGS
        start, end = self.indptr[term_id], self.indptr[term_id + 1]
        return self.docs[start:end], self.tfs[start:end], self.title_tfs[start:end]


def title_tfs(doc: LiveDocument) -> np.ndarray:
    """A document's title frequencies (none in its title when written before fields: a log replays them analysed)."""
    return doc.title_tfs if doc.title_tfs is not None else np.zeros(len(doc.term_ids), dtype=np.uint8)


def _term_of_entries(indptr: np.ndarray) -> np.ndarray:
    return np.repeat(np.arange(len(indptr) - 1, dtype=np.int64), np.diff(indptr))


class LiveSegment:
    """Immutable arrays over the live documents: term postings (by term id), lengths, vectors, a chunked index's
    passages. A refresh that only added documents extends the previous segment (`extended`): the new documents'
    postings become one more chunk (neighbouring chunks of similar size merged, so there are a few), their vectors
    are appended to a shared buffer; only a refresh after a live document was deleted or replaced rebuilds it."""

    def __init__(self, docs: list[LiveDocument], dimension: int, vocabulary: dict[str, int]):
        self.docs, self.vocabulary, self.dimension = docs, vocabulary, dimension  # the vocabulary only grows
        self._chunks = (_TermChunk.of(docs, 0, len(vocabulary)),) if docs else ()
        self.lengths = np.array([d.length for d in docs], dtype=np.int64)
        self.title_lengths = np.array([d.title_length for d in docs], dtype=np.int64)
        self._rows = _Rows(np.stack([d.vector for d in docs]).astype(np.float32) if docs else np.empty((0, dimension), np.float32))
        self.vectors = self._rows.buffer[: len(docs)]
        self.fields = frozenset(name for doc in docs for name in doc.metadata)  # the metadata fields the documents hold
        # a chunked index's passages of these documents: each one's document (its position here), span and vector
        self.passage_rows, self.passage_spans, self.passage_vectors = _passages(docs, 0, dimension)
        self._previous: LiveSegment | None = None  # what this one extends (its cached results are reused)
        self._columns: dict[_ColumnsKey, MetadataColumns | None] = {}

    def extended(self, added: list[LiveDocument]) -> LiveSegment:
        """This segment's documents followed by `added` (every segment before it stays as it is)."""
        if not added:
            return self
        segment = LiveSegment.__new__(LiveSegment)
        segment.docs, segment.vocabulary, segment.dimension = self.docs + added, self.vocabulary, self.dimension
        chunks = [*self._chunks, _TermChunk.of(added, len(self.docs), len(self.vocabulary))]
        while len(chunks) > 1 and chunks[-2].count <= 2 * chunks[-1].count:  # like sizes merge: O(log) chunks
            chunks[-2:] = [chunks[-2].merged(chunks[-1])]
        segment._chunks = tuple(chunks)
        segment.lengths = np.concatenate([self.lengths, [d.length for d in added]]).astype(np.int64)
        segment.title_lengths = np.concatenate([self.title_lengths, [d.title_length for d in added]]).astype(np.int64)
        rows = self._rows if self._rows.length == len(self.docs) else _Rows(self.vectors.copy())  # extended once: shared
        segment._rows = rows
        segment.vectors = rows.append(np.stack([d.vector for d in added]).astype(np.float32))
        segment.fields = self.fields | {name for doc in added for name in doc.metadata}
        rows_added, spans, vectors = _passages(added, len(self.docs), self.dimension)
        segment.passage_rows = np.concatenate([self.passage_rows, rows_added])
        segment.passage_spans = np.concatenate([self.passage_spans, spans])
        segment.passage_vectors = np.concatenate([self.passage_vectors, vectors])
        segment._previous, segment._columns = self, {}
        self._previous = None  # a chain of one: older segments are not kept alive by newer ones
        return segment

    def __len__(self) -> int:
        return len(self.docs)

    def postings(self, term: str) -> tuple[np.ndarray, np.ndarray]:
        """(live document positions, term frequencies) of `term`."""
        return self.field_postings(term)[:2]

    def field_postings(self, term: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(live document positions, term frequencies, the title's share of each) of `term`."""
        term_id = self.vocabulary.get(term)
        if term_id is None:
            return _NO_FIELD_POSTINGS
        parts = [part for part in (chunk.postings(term_id) for chunk in self._chunks) if len(part[0])]
        if len(parts) < 2:
            return parts[0] if parts else _NO_FIELD_POSTINGS
        return tuple(np.concatenate(arrays) for arrays in zip(*parts))  # type: ignore[return-value]  # three arrays

    def columns(self, types: dict[str, str | None], base_fields: Collection[str]) -> MetadataColumns | None:
        """The filterable metadata columns of these documents, each field of the type the collection decided for it
        (None: not filterable, never a column from writes), and a column for each filterable field that writes added
        to the base's (`base_fields`), held by no document or not; made once, from the previous segment's columns
        and the added documents' when this segment extends one (a field's type, once decided, never changes)."""
        key = (tuple(sorted(types.items())), tuple(sorted(base_fields)))
        if key in self._columns:
            return self._columns[key]
        previous = self._previous
        if previous is not None and key in previous._columns:
            added = _live_columns(types, self.docs[len(previous) :], base_fields)
            made = concat_columns(previous._columns[key], added, len(previous), len(self) - len(previous))
        else:
            made = _live_columns(types, self.docs, base_fields)
        self._columns[key] = made
        return made


def _passages(docs: list[LiveDocument], first: int, dimension: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(each passage's document position, its span, its vector) over the chunked documents among `docs`."""
    chunked = [(i, d) for i, d in enumerate(docs, first) if d.passage_spans is not None]
    counts = [len(d.passage_spans) for _, d in chunked]  # type: ignore[arg-type]  # chunked: spans set
    rows = np.repeat(np.array([i for i, _ in chunked], np.int64), counts)
    spans = np.concatenate([d.passage_spans for _, d in chunked]) if chunked else np.empty((0, 2), np.int64)
    vectors = np.concatenate([d.passage_vectors for _, d in chunked]) if chunked else np.empty((0, dimension), np.float32)
    return rows, spans, vectors


def _live_columns(types: dict[str, str | None], docs: list[LiveDocument], base_fields: Collection[str]) -> MetadataColumns | None:
    filterable = {name: kind for name, kind in types.items() if kind is not None}
    added = [name for name in filterable if name not in base_fields]
    if not docs and not added:
        return None
    collector = MetadataCollector(types=filterable)
    for doc in docs:
        collector.add({name: value for name, value in doc.metadata.items() if name in filterable})
    columns = collector.finish()
    for name in added:
        if name not in columns.columns:
            columns.columns[name] = collector.empty_column(filterable[name])
            columns.fields[name] = FieldInfo(filterable[name], 0, 0 if filterable[name] == "keyword" else None)
    return columns if columns.columns else None


LIVE_METHOD = "lucene"  # the BM25 variant live statistics are computed for (search.postings)


def check_live_method(params: BM25Params) -> None:
    """Live statistics are computed for the Lucene variant only (search.postings)."""
    if params.method != LIVE_METHOD:
        raise ConfigError(
            f"live writes score BM25 with the lucene method; this index was built with {params.method!r}: "
            "rebuild it with --bm25-method lucene to accept writes"
        )


@dataclass(frozen=True)
class CorpusStatistics:
    """The BM25 statistics of a corpus (or of one shard's part of it: shards' parts add up to the corpus's): the
    documents that exist, their total length in tokens, and the document frequency of some terms."""

    documents: int
    length: int
    df: dict[str, int]
    title_length: int = 0  # of which in titles (search.fields)

    @property
    def avgdl(self) -> float:
        return self.length / max(1, self.documents)

    @property
    def field_averages(self) -> tuple[float, float]:
        """The average title's length, and the average text's."""
        count = max(1, self.documents)
        return self.title_length / count, (self.length - self.title_length) / count

    @classmethod
    def total(cls, parts: list[CorpusStatistics]) -> CorpusStatistics:
        df: Counter[str] = Counter()
        for part in parts:
            df.update(part.df)
        return cls(sum(p.documents for p in parts), sum(p.length for p in parts), dict(df), sum(p.title_length for p in parts))


class LiveBM25:
    """BM25 (Lucene variant) over alive base documents and live ones, with the statistics of exactly those:
    rankings equal a fresh build's of the same documents. A shard scores with its whole corpus's statistics instead
    (`scores(query, statistics)`), so a document's score does not depend on the shard that holds it."""

    def __init__(self, base: BM25Index, postings: Postings, params: BM25Params, base_alive: np.ndarray, live: LiveSegment):
        check_live_method(params)
        self.analyzer, self.params, self.postings, self.alive, self.live = base.analyzer, params, postings, base_alive, live
        self._vocab, self._base = base.vocabulary, base
        self.base_docs = len(base_alive)
        self.num_docs = self.base_docs + len(live)
        self.collection_size = int(base_alive.sum()) + len(live)
        self.total_length = int(postings.lengths[base_alive].sum()) + int(live.lengths.sum())
        self.avgdl = self.total_length / max(1, self.collection_size)
        self._base_df = postings.document_frequency(base_alive)
        # Per average length (this snapshot's, or a corpus's that a shard is given), the length normalisation of every
        # document, k1 * (1 - b + b * |d| / avgdl), and a term's base weights: the same for every query until it changes.
        # The caches wrap functions of the arrays, not methods of self: a cycle through self would keep each refresh's
        # segment, weights and documents until a full garbage collection (gigabytes during a bulk load at 1M).
        self._norms = functools.lru_cache(maxsize=2)(functools.partial(_length_norms, params, postings.lengths, live.lengths))
        alive = None if base_alive.all() else base_alive
        self._base_weights = _WeightCache(functools.partial(_base_weights, postings, alive, self._norms))
        self.has_fields = postings.has_fields  # title frequencies: title and text can be weighted (search.fields)
        self.title_length = 0
        if self.has_fields:
            assert postings.title_lengths is not None  # has_fields
            self.title_length = int(postings.title_lengths[base_alive].sum()) + int(live.title_lengths.sum())
            count = max(1, self.collection_size)
            self.field_averages = (self.title_length / count, (self.total_length - self.title_length) / count)
            self._field_norms = functools.lru_cache(maxsize=2)(functools.partial(_field_norms, params, postings, live))
            self._base_field_weights = _WeightCache(functools.partial(_base_field_weights, postings, alive, self._field_norms, params.k1))

    def df(self, term: str) -> int:
        """Documents that exist and contain `term`."""
        term_id = self._vocab.get(term)
        return (int(self._base_df[term_id]) if term_id is not None else 0) + len(self.live.postings(term)[0])

    def statistics(self, terms: Iterable[str]) -> CorpusStatistics:
        """This segment's statistics, with the document frequencies of `terms`."""
        return CorpusStatistics(self.collection_size, self.total_length, {t: self.df(t) for t in set(terms)}, self.title_length)

    def posting_lists(
        self, query: str, statistics: CorpusStatistics | None = None, typo: str | int | Variants = 0, fields: FieldWeights | None = None
    ) -> list[PostingList]:
        """Each query term's base and live entries, in query order: idf(t) * tf / (tf + k1 * (1 - b + b * |d| / avgdl))
        (search.postings), with the document count, avgdl and document frequencies of `statistics` (default: of this
        segment). Deleted documents have none. A term no document holds stands for its typo variants under `typo`
        (search.typo), all their lists one group, each one's weights times its distance's weight. With `fields`
        (title, text weights), BM25F's saturated frequencies instead, at the fields' average lengths (search.fields)."""
        assert fields is None or self.has_fields  # older indexes refuse fields (SearchPipeline._check_text_fields)
        n, avgdl = (self.collection_size, self.avgdl) if statistics is None else (statistics.documents, statistics.avgdl)
        averages = statistics.field_averages if statistics is not None else self.field_averages if self.has_fields else (0.0, 0.0)
        df = self.df if statistics is None else lambda term: statistics.df.get(term, 0)
        terms = self.analyzer.query_terms(query)
        if isinstance(typo, dict):  # the variants themselves (a shard's, chosen by its coordinator for the whole index)
            variants = typo
        else:  # statistics without variants: a shard that was told none
            unheld = statistics is None and any(df(term) == 0 for term in terms)
            variants = self.variants(query, typo) if typo != 0 and unheld else {}
        lists = []
        for position, term in enumerate(terms):  # a repeated term counts again (bm25s, Lucene)
            alternatives = [(v, VARIANT_WEIGHTS[d]) for v, d in variants[term]] if term in variants else [(term, 1.0)]
            for name, weight in alternatives:
                group = position if len(alternatives) > 1 else None
                lists += self._term_lists(name, weight, df(name), (n, avgdl, averages), group, fields)
        return lists

    def _term_lists(
        self,
        term: str,
        weight: float,
        df: int,
        corpus: tuple[int, float, tuple[float, float]],
        group: int | None,
        fields: FieldWeights | None,
    ) -> list[PostingList]:
        """A term's lists (base, live), `weight` times its BM25 weights (or BM25F's, weighting `fields`), with the
        `corpus`'s document count, average length and fields' average lengths."""
        n, avgdl, averages = corpus
        if df == 0:
            return []
        idf = weight * float(np.log(1.0 + (n - df + 0.5) / (df + 0.5)))
        lists = []
        if (term_id := self._vocab.get(term)) is not None:
            if fields is None:
                docs, weights, largest = self._base_weights(term_id, avgdl)
            else:
                docs, weights, largest = self._base_field_weights(term_id, (averages, fields))
            if len(docs):
                lists.append(PostingList(docs, weights, idf * largest, idf, group=group))
        live_idx, live_tf, live_title_tf = self.live.field_postings(term)
        if len(live_idx):
            if fields is None:
                weights = live_tf / (live_tf + self._norms(avgdl)[1][live_idx])
            else:
                title_norms, text_norms = self._field_norms(averages)[1]
                weights = saturated(live_tf, live_title_tf, title_norms[live_idx], text_norms[live_idx], fields, self.params.k1)
                live_idx, weights = live_idx[weights > 0], weights[weights > 0]
            if len(live_idx):
                lists.append(PostingList(self.base_docs + live_idx.astype(np.int64), weights, idf * float(weights.max()), idf, group=group))
        return lists

    def variants(self, query: str, typo: str | int) -> dict[str, list[tuple[str, int]]]:
        """The typo variants (term, edits) of each query term no document holds (search.typo): among the base's terms
        and those only written since."""
        return typo_variants(self.analyzer, query, typo, lambda term: self.df(term) > 0, self.near, self.df)

    def typo_terms(self, query: str, typo: str | int) -> TypoTerms:
        """What these documents hold of what `query`'s typos may be matched to (a shard's part: search.sharded)."""
        return TypoTerms.of(self.analyzer, query, typo, self.df, self.near)

    def near(self, term: str, edits: int) -> list[tuple[str, int]]:
        """The terms within `edits` of `term` among the base's and those only written since (some may be held by
        deleted documents only: `df` says)."""
        return [*self._base.near(term, edits), *((self._written.terms[at], d) for at, d in self._written.near(term, edits))]

    @functools.cached_property
    def _written(self) -> Lexicon:
        """The terms only live documents hold (built at the first typo that needs it: a view lasts until the next
        refresh)."""
        return Lexicon(t for t in list(self.live.vocabulary) if t not in self._vocab)

    def scores(
        self, query: str, statistics: CorpusStatistics | None = None, typo: str | int | Variants = 0, fields: FieldWeights | None = None
    ) -> np.ndarray:
        """BM25 score of every document (base then live numbering); 0 for deleted ones and non-matches: the
        exhaustive reference of `leg`."""
        return exhaustive_scores(self.posting_lists(query, statistics, typo, fields), self.num_docs, np.dtype(np.float64))

    def leg(
        self,
        query: str,
        depth: int,
        allowed: Allowed | None = None,
        statistics: CorpusStatistics | None = None,
        prune: bool | None = None,
        typo: str | int | Variants = 0,
        fields: FieldWeights | None = None,
    ) -> tuple[Ranking, ScoreOf]:
        """As BM25Index.leg, over both segments (`prune` None: summed); `fields` weights title and text (search.fields)."""
        lists, dtype = self.posting_lists(query, statistics, typo, fields), np.dtype(np.float64)
        # pruned only when asked: these lists are copied end to end and their window bounds made at each query, which
        # reads every entry as the sum does (a BM25Index's lists are slices of one matrix with their bounds kept)
        if not prune:
            return exhaustive_leg(exhaustive_scores(lists, self.num_docs, dtype), depth, allowed)
        return top_k_pruned(lists, depth, self.num_docs, dtype, allowed), lambda ids: score_documents(lists, ids, dtype)

    def with_statistics(self, statistics: CorpusStatistics) -> CorpusScoredBM25:
        return CorpusScoredBM25(self, statistics)


def _length_norms(params: BM25Params, base_lengths: np.ndarray, live_lengths: np.ndarray, avgdl: float) -> tuple[np.ndarray, np.ndarray]:
    """k1 * (1 - b + b * |d| / avgdl) of every base and every live document."""
    k1, b = params.k1, params.b
    return (
        k1 * (1.0 - b + b * np.asarray(base_lengths, dtype=np.float64) / avgdl),
        k1 * (1.0 - b + b * live_lengths.astype(np.float64) / avgdl),
    )


def _base_weights(
    postings: Postings, alive: np.ndarray | None, norms: Callable[[float], tuple[np.ndarray, np.ndarray]], term_id: int, avgdl: float
) -> tuple[np.ndarray, np.ndarray, float]:
    """The alive base documents holding the term (`alive` None: all are), tf / (tf + k1 * (1 - b + b * |d| / avgdl))
    of each, the largest."""
    docs, tfs = postings.term(term_id)
    if alive is not None:
        keep = alive[docs]
        docs, tfs = docs[keep], tfs[keep]
    weights = tfs / (tfs + norms(avgdl)[0][docs])
    return docs, weights, float(weights.max(initial=0.0))


def _field_norms(
    params: BM25Params, postings: Postings, live: LiveSegment, averages: tuple[float, float]
) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """The title's and the text's length normalisations of every base and every live document (search.fields)."""
    assert postings.title_lengths is not None  # has_fields
    return (
        length_norms(postings.title_lengths, postings.lengths, averages, params.b),
        length_norms(live.title_lengths, live.lengths, averages, params.b),
    )


def _base_field_weights(
    postings: Postings,
    alive: np.ndarray | None,
    norms: Callable[[tuple[float, float]], tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]],
    k1: float,
    term_id: int,
    key: tuple[tuple[float, float], FieldWeights],
) -> tuple[np.ndarray, np.ndarray, float]:
    """As _base_weights, BM25F's (search.fields) at `key` (the fields' average lengths, their weights); documents
    holding the term only in a field weighted 0 are left out."""
    averages, weights = key
    docs, tfs = postings.term(term_id)
    title_tfs = postings.title_term(term_id)
    if alive is not None:
        keep = alive[docs]
        docs, tfs, title_tfs = docs[keep], tfs[keep], title_tfs[keep]
    title_norms, text_norms = norms(averages)[0]
    found = saturated(tfs, title_tfs, title_norms[docs], text_norms[docs], weights, k1)
    held = found > 0
    return docs[held], found[held], float(found.max(initial=0.0))


class _WeightCache:
    """A term's base weights at an average length, the least recently used dropped past WEIGHT_CACHE_BYTES: memory
    bounded whatever the queries (a bound on the number of terms let a large collection's frequent terms take hundreds
    of MB)."""

    def __init__(self, compute: Callable[[int, Any], tuple[np.ndarray, np.ndarray, float]]):
        self._compute = compute
        self._entries: OrderedDict[tuple[int, Any], tuple[np.ndarray, np.ndarray, float]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def __call__(self, term_id: int, avgdl: Any) -> tuple[np.ndarray, np.ndarray, float]:
        """The weights at `avgdl`: an average length, or any key of what they depend on."""
        key = (term_id, avgdl)
        with self._lock:
            if (found := self._entries.get(key)) is not None:
                self._entries.move_to_end(key)
                return found
        found = self._compute(term_id, avgdl)
        size = _owned_bytes(found)
        with self._lock:
            if key not in self._entries and size <= WEIGHT_CACHE_BYTES:
                self._entries[key], self._bytes = found, self._bytes + size
                while self._bytes > WEIGHT_CACHE_BYTES:
                    self._bytes -= _owned_bytes(self._entries.popitem(last=False)[1])
        return found

    @property
    def nbytes(self) -> int:
        return self._bytes


def _owned_bytes(weights: tuple[np.ndarray, np.ndarray, float]) -> int:
    """What an entry holds in memory of its own (its documents may be a view of the memory-mapped postings)."""
    return sum(array.nbytes for array in weights[:2] if array.flags.owndata)


class CorpusScoredBM25:
    """A LiveBM25 that scores with a whole corpus's statistics (a shard's, summed by its coordinator)."""

    def __init__(self, bm25: LiveBM25, statistics: CorpusStatistics):
        self.bm25, self.statistics, self.analyzer = bm25, statistics, bm25.analyzer
        self.has_fields = bm25.has_fields

    def scores(self, query: str) -> np.ndarray:
        return self.bm25.scores(query, self.statistics)

    def leg(
        self, query: str, depth: int, allowed: Allowed | None = None, typo: str | int | Variants = 0, fields: FieldWeights | None = None
    ) -> tuple[Ranking, ScoreOf]:
        """`typo`: the variants the coordinator chose, whose statistics `statistics` holds (search.sharded)."""
        return self.bm25.leg(query, depth, allowed, self.statistics, typo=typo, fields=fields)


class LiveVectors:
    """`vectors[ids]` across the base embeddings and the live segment's vectors (or any two row arrays of one dtype:
    a chunked index's passage spans)."""

    def __init__(self, base: np.ndarray, live: np.ndarray):
        self.base, self.live = base, live
        self.base_docs = len(base)

    def __len__(self) -> int:
        return self.base_docs + len(self.live)

    def __getitem__(self, ids: object) -> np.ndarray:
        keys = np.asarray(ids, dtype=np.int64)
        if keys.ndim == 0:
            row: np.ndarray = self[keys.reshape(1)][0]
            return row
        out = np.empty((len(keys), self.base.shape[1]), dtype=self.base.dtype)
        in_base = keys < self.base_docs
        out[in_base] = self.base[keys[in_base]]
        out[~in_base] = self.live[keys[~in_base] - self.base_docs]
        return out

    def __matmul__(self, vector: np.ndarray) -> np.ndarray:
        """Every row's product with `vector`, base then live."""
        return np.concatenate([self.base @ vector, self.live @ vector])


class LiveDense:
    """Dense search over the base FAISS index and the live vectors (scored exactly: the live segment is small)."""

    def __init__(self, base: DenseIndex, live_vectors: np.ndarray):
        self.base, self.live_vectors = base, live_vectors
        self.params, self.dimension, self.on_gpu = base.params, base.dimension, base.on_gpu
        self.base_docs = base.num_docs
        self.num_docs = base.num_docs + len(live_vectors)

    def brute_force(self, allowed: Allowed) -> bool:
        return self.base.brute_force(allowed)

    def search(self, vector: np.ndarray, depth: int, allowed: Allowed | None = None) -> Ranking:
        if allowed is None:
            base = self.base.search(vector, depth)
            live_ids = np.arange(len(self.live_vectors), dtype=np.int64)
            live_scores = self.live_vectors @ vector  # in place: gathering every live row first copied them all per query
        else:
            base_allowed = Allowed(allowed.mask[: self.base_docs])
            base = self.base.search(vector, depth, base_allowed) if base_allowed.count else Ranking.empty()
            live_ids = allowed.ids[allowed.ids >= self.base_docs] - self.base_docs
            live_scores = self.live_vectors[live_ids] @ vector
        ids = np.concatenate([base.doc_idx, live_ids + self.base_docs])
        scores = np.concatenate([base.scores.astype(np.float32), live_scores])
        best = top_k(scores, depth)
        return Ranking(ids[best.doc_idx], best.scores)


def concat_columns(base: MetadataColumns | None, live: MetadataColumns | None, base_docs: int, live_docs: int) -> MetadataColumns | None:
    """One set of metadata columns over both segments (a field missing from a segment is missing in its documents)."""
    if base is None and live is None:
        return None
    fields = {**(base.fields if base else {}), **(live.fields if live else {})}
    columns: dict[str, KeywordColumn | ValueColumn] = {}
    for name in sorted({*(base.columns if base else {}), *(live.columns if live else {})}):
        parts = [(part.columns.get(name) if part else None, n) for part, n in ((base, base_docs), (live, live_docs))]
        columns[name] = _concat_column(fields[name].type, parts)
    return MetadataColumns(fields, columns, base_docs + live_docs)


def _concat_column(field_type: str | None, parts: list[tuple[KeywordColumn | ValueColumn | None, int]]) -> KeywordColumn | ValueColumn:
    # a field's columns in every segment are of its type: KeywordColumn for keyword, else ValueColumn
    if field_type == "keyword":
        keyword_parts = cast(list[tuple[KeywordColumn | None, int]], parts)
        vocab = sorted({v for column, _ in keyword_parts if column is not None for v in column.vocab})
        new_id = {v: i for i, v in enumerate(vocab)}
        offsets: list[np.ndarray] = [np.zeros(1, dtype=np.int64)]
        value_ids: list[np.ndarray] = []
        end = 0
        for column, n in keyword_parts:
            if column is None:
                offsets.append(np.full(n, end, dtype=np.int64))
                continue
            remap = np.array([new_id[v] for v in column.vocab], dtype=np.int32)
            value_ids.append(remap[column.value_ids] if len(remap) else column.value_ids)
            offsets.append(column.offsets[1:] + end)
            end += int(column.offsets[-1])
        return KeywordColumn(vocab, np.concatenate(offsets), np.concatenate(value_ids) if value_ids else np.empty(0, np.int32))
    dtypes: dict[str | None, type[np.generic]] = {"bool": np.bool_, "int": np.int64}
    dtype = dtypes.get(field_type, np.float64)
    value_parts = cast(list[tuple[ValueColumn | None, int]], parts)
    values: list[np.ndarray] = [column.values.astype(dtype) if column is not None else np.zeros(n, dtype) for column, n in value_parts]
    present = [column.present if column is not None else np.zeros(n, bool) for column, n in value_parts]
    return ValueColumn(np.concatenate(values), np.concatenate(present))


class PassageBM25:
    """BM25 over a chunked index's passages, with the statistics of the passages that exist (LiveBM25 over the base's
    passage postings and the written documents' passages), each document scored by its best passage."""

    def __init__(
        self, base: BM25Index, postings: Postings, params: BM25Params, rows: np.ndarray, alive: np.ndarray, live: LiveSegment, num_docs: int
    ):
        self.base, self.postings, self.params = base, postings, params
        self.scorer = LiveBM25(base, postings, params, alive, live)
        self.rows, self.num_docs = rows, num_docs

    def variants(self, query: str, typo: str | int) -> dict[str, list[tuple[str, int]]]:
        return self.scorer.variants(query, typo)

    def scores(self, query: str, typo: str | int = 0) -> np.ndarray:
        """Every document's best passage's BM25 score (0: no passage matches)."""
        passage_scores = self.scorer.scores(query, typo=typo)
        hit = np.flatnonzero(passage_scores)
        out = np.zeros(self.num_docs, dtype=np.float32)
        if len(hit):
            docs, best = aggregate(passage_scores[hit], self.rows[hit], PassageSpec())
            out[docs] = best
        return out

    def leg(self, query: str, depth: int, allowed: Allowed | None = None, typo: str | int = 0) -> tuple[Ranking, ScoreOf]:
        """Exhaustive: a document's best passage is a maximum, which MaxScore's sums do not bound."""
        return exhaustive_leg(self.scores(query, typo), depth, allowed)


def live_passages(base: PassageIndex, live: LiveSegment, terms: LiveSegment, base_alive: np.ndarray) -> PassageIndex:
    """A chunked index's passages after writes: the base's (a deleted document's are excluded by the caller's allowed
    set, as its document is) and the written documents', numbered after the base's documents and passages. `terms`:
    the written passages' postings, in the same order."""
    base_docs = base.num_docs
    dense, vectors, spans = cast(DenseIndex, base.dense), cast(np.ndarray, base.vectors), cast(np.ndarray, base.spans)  # a base's own
    rows = np.concatenate([base.rows, live.passage_rows + base_docs])
    lexical = None
    if base.lexical is not None:
        lexical = PassageBM25(
            base.lexical.base, base.lexical.postings, base.lexical.params, rows, base_alive[base.rows], terms, base_docs + len(live)
        )
    return PassageIndex(
        LiveDense(dense, live.passage_vectors),
        LiveVectors(vectors, live.passage_vectors),
        rows,
        LiveVectors(spans, live.passage_spans),
        base_docs + len(live),
        lexical,
    )
