"""The coordinator of a sharded search: each leg goes to every shard, the shards' top-`depth` lists are merged into
the global top-`depth`, then fusion, hubness floors and reranking run once, as for one index.

Shards number their documents by their position in the whole index (indexer.shards), score BM25 with corpus-wide
statistics and hold each document's hubness biases, so a merged leg is the unsharded leg: every document of the
global top-`depth` is in its shard's top-`depth`, with the same score, and ties break by the same position. A
hybrid search asks each shard for its candidates (both local lists, every member with both scores), so the global
candidates' scores are all known after one round; a dynamic hubness variant first asks every shard for its raw
top-1 (its banks are decided on the whole corpus's), then searches with the coefficients that decides.

After writes (indexer.shards.ShardedCollection), the corpus statistics change in every shard: a BM25 leg then first
sums each shard's statistics of the query's terms and every shard scores with that sum (Elasticsearch's DFS query),
and written documents, numbered after the split's, keep the whole index's order too.

`ShardClient` is what a search asks of a shard (indexer.shards.ShardSearcher in process, a Ray Serve deployment
across machines: cluster.serve); what it sends and gets back are the frozen dataclasses below, plain data that
crosses processes. A `ShardGroup` makes one call to all of them at once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, Generic, Literal, Protocol, TypeVar

import numpy as np

from hybrid_retrieval.common.errors import SpecError
from hybrid_retrieval.search.analyzer import Analyzer
from hybrid_retrieval.search.filters.columns import KeywordColumn, MetadataCollector, MetadataColumns, ValueColumn
from hybrid_retrieval.search.filters.types import FieldInfo
from hybrid_retrieval.search.fusion import RETRIEVERS, Candidates
from hybrid_retrieval.search.hubness import HubnessCorrection, HubnessParams, score_floor
from hybrid_retrieval.search.pipeline import SearchPipeline, Stopwatch
from hybrid_retrieval.search.ranking import Ranking
from hybrid_retrieval.search.rerank import Reranker
from hybrid_retrieval.search.segments import CorpusStatistics, concat_columns
from hybrid_retrieval.search.spec import HubnessSpec, PassageSpec, SearchSpec
from hybrid_retrieval.search.typo import TypoTerms, Variants

Leg = Literal["bm25", "dense"]
MinSeq = tuple[int, ...]  # by shard, the writer sequence number a shard must have caught up with (empty: none)


@dataclass(frozen=True)
class Consistency:
    """What a search's shard requests carry once the index took writes: `min_seq`, and for a BM25 leg the corpus
    statistics of the query's terms (None: the split's, which each shard scores with)."""

    min_seq: MinSeq = ()
    statistics: CorpusStatistics | None = None


@dataclass(frozen=True)
class ShardSearchRequest:
    """One search as every shard runs it: the legs of the documents `filter` admits, corrected by `hubness` with the
    coordinator's bias coefficients `coef` (a dense leg)."""

    query: str
    depth: int
    filter: dict[str, Any] | None = None
    vector: np.ndarray | None = None
    hubness: str = "none"
    coef: np.ndarray | None = None
    consistency: Consistency = Consistency()
    text_fields: dict[str, float] | None = None  # the BM25 leg's field weights (search.fields)
    excluded: np.ndarray | None = None  # positions left out besides the filter's (curation's hidden documents)
    variants: Variants | None = None  # the typos' variants the coordinator chose (search.typo)


@dataclass(frozen=True)
class ShardRanking:
    """A shard's local top-`depth` of one leg, in the whole index's numbering (positions)."""

    positions: np.ndarray
    scores: np.ndarray


@dataclass(frozen=True)
class ShardCandidates:
    """A shard's hybrid candidates: every member of either leg's local list with both raw scores (by leg, aligned with
    `positions`), and each leg's list."""

    positions: np.ndarray
    scores: dict[str, np.ndarray]
    rankings: dict[str, ShardRanking]


@dataclass(frozen=True)
class FieldColumns:
    """The filterable fields' values of the documents at `positions` that a shard holds: its columns' rows (plain
    data, for a coordinator's boosts and sorts)."""

    positions: np.ndarray
    fields: dict[str, FieldInfo]
    columns: dict[str, KeywordColumn | ValueColumn]


@dataclass(frozen=True)
class ShardTop1:
    """A shard's raw (uncorrected) dense top-1 and the hubness banks it activates."""

    position: int
    score: float
    query: bool
    gallery: bool


class ShardClient(Protocol):
    """What a search asks of a shard; `min_seq` as in Consistency."""

    def search(self, leg: Leg, request: ShardSearchRequest) -> ShardRanking: ...
    def candidates(self, request: ShardSearchRequest) -> ShardCandidates: ...
    def statistics(self, terms: list[str], min_seq: MinSeq = ()) -> CorpusStatistics: ...
    def raw_top1(self, vector: np.ndarray) -> ShardTop1 | None: ...
    def facet_counts(self, names: list[str], positions: np.ndarray, min_seq: MinSeq = ()) -> dict[str, list[tuple[Any, int]]]: ...
    def positions_of(self, ids: list[str], min_seq: MinSeq = ()) -> list[int | None]: ...
    def typo_terms(self, query: str, typo: str | int, min_seq: MinSeq = ()) -> TypoTerms: ...
    def admits(self, filter_: dict[str, Any], positions: np.ndarray, min_seq: MinSeq = ()) -> np.ndarray: ...
    def field_columns(self, positions: np.ndarray, min_seq: MinSeq = ()) -> FieldColumns: ...


C = TypeVar("C", covariant=True)  # a group of writers is a group of clients too (indexer.shards: in process, one group)
A = TypeVar("A")
T = TypeVar("T")


class ShardGroup(Generic[C]):
    """Makes a call to every shard at once and returns their answers in shard order."""

    def __init__(self, clients: Sequence[C], executor: ThreadPoolExecutor | None = None):
        self.clients: tuple[C, ...] = tuple(clients)
        self._executor = executor or ThreadPoolExecutor(max(1, len(self.clients)), thread_name_prefix="shard")

    def __len__(self) -> int:
        return len(self.clients)

    def all(self, call: Callable[[C], T]) -> list[T]:
        return list(self._gather({i: self._executor.submit(call, client) for i, client in enumerate(self.clients)}).values())

    def some(self, call: Callable[[C, A], T], parts: Mapping[int, A]) -> dict[int, T]:
        """`call(client, part)` of each shard's part."""
        return self._gather({i: self._executor.submit(call, self.clients[i], part) for i, part in parts.items()})

    @staticmethod
    def _gather(futures: dict[int, Future[T]]) -> dict[int, T]:
        """Every call is finished before an error is raised: nothing keeps running behind it (a write's other parts)."""
        wait(futures.values())
        return {i: future.result() for i, future in futures.items()}

    def close(self) -> None:
        self._executor.shutdown(wait=False)


def by_owner(owners: np.ndarray, positions: np.ndarray, shards: int) -> dict[int, np.ndarray]:
    """The positions to ask each shard about: its own, or all of them of every shard when some owner is unknown (-1:
    a document written since the split; each shard answers for those it holds)."""
    if (owners < 0).any():
        return {i: positions for i in range(shards)}
    return {int(i): positions[owners == i] for i in np.unique(owners)}


def merge_top(parts: Sequence[ShardRanking], depth: int) -> Ranking:
    """The best `depth` of the shards' lists: by score, ties by lower position (as search.ranking.top_k)."""
    if not parts:
        return Ranking.empty()
    positions = np.concatenate([np.asarray(part.positions, dtype=np.int64) for part in parts])
    scores = np.concatenate([np.asarray(part.scores) for part in parts])
    order = np.lexsort((positions, -scores))[:depth]
    return Ranking(positions[order], scores[order])


def merge_candidates(parts: Sequence[ShardCandidates], depth: int, floors: dict[str, float] | None) -> Candidates:
    """The global candidates from each shard's: each leg's global top-`depth` of the shards' leg lists, every member
    with both raw scores as its shard computed them."""
    rankings = {leg: merge_top([part.rankings[leg] for part in parts], depth) for leg in RETRIEVERS}
    positions = np.concatenate([np.asarray(part.positions, dtype=np.int64) for part in parts])
    order = np.argsort(positions, kind="stable")
    positions = positions[order]
    known = {leg: np.concatenate([np.asarray(part.scores[leg], dtype=np.float64) for part in parts])[order] for leg in RETRIEVERS}

    def score_of(leg: str) -> Callable[[np.ndarray], np.ndarray]:
        return lambda idx: known[leg][np.searchsorted(positions, idx)]

    return Candidates.from_rankings(rankings, {leg: score_of(leg) for leg in RETRIEVERS}, floors)


@dataclass(frozen=True)
class ShardFilter:
    """A checked filter (None: every document), evaluated by each shard over its own documents, and the positions of
    documents it leaves out besides (curation's hidden ones)."""

    filter: dict[str, Any] | None
    excluded: np.ndarray | None = None


class ShardedColumns(MetadataColumns):
    """The coordinator's view of the metadata: filters are checked here (the fields' types are known: an empty
    column of each type evaluates a filter over no document and raises the same errors) and evaluated by the shards;
    facets are counted by the shards holding the hits and added up."""

    def __init__(
        self,
        fields: dict[str, FieldInfo],
        shards: ShardGroup[ShardClient],
        owner: Callable[[np.ndarray], np.ndarray],
        min_seq: Callable[[], MinSeq],
    ):
        collector = MetadataCollector()  # of no document
        empty = {name: collector.empty_column(info.type) for name, info in fields.items() if info.type is not None}
        super().__init__(fields, empty, 0)
        self.shards, self.owner, self.min_seq = shards, owner, min_seq

    def facets(self, names: Sequence[str], docs: np.ndarray, size: int) -> dict[str, list[dict]]:
        min_seq = self.min_seq()
        asked = by_owner(self.owner(docs), docs, len(self.shards))
        answers = self.shards.some(lambda shard, part: shard.facet_counts(list(names), part, min_seq), asked)
        out = {}
        for name in names:
            totals: dict[Any, int] = {}
            for counts in answers.values():
                for value, count in counts[name]:
                    totals[value] = totals.get(value, 0) + count
            pairs = sorted(totals.items())  # value order, then by count (stable), as MetadataColumns.facets
            pairs.sort(key=lambda pair: -pair[1])
            out[name] = [{"value": value, "count": count} for value, count in pairs[:size]]
        return out

    def for_docs(self, docs: np.ndarray) -> tuple[MetadataColumns, Callable[[np.ndarray], np.ndarray]]:
        """The documents' field values, from the shards holding them, as columns of their own (one round to the
        shards: boosts and sorts read a few hundred candidates), and each document's row in them."""
        min_seq = self.min_seq()
        asked = by_owner(self.owner(docs), docs, len(self.shards))
        answers = self.shards.some(lambda shard, part: shard.field_columns(part, min_seq), asked)
        held, columns, count = [], None, 0
        for part in answers.values():
            found = MetadataColumns(part.fields, part.columns, len(part.positions)) if part.columns else None
            columns = concat_columns(columns, found, count, len(part.positions))
            held.append(part.positions)
            count += len(part.positions)
        positions = np.concatenate(held) if held else np.empty(0, dtype=np.int64)
        order = np.argsort(positions, kind="stable")
        merged = columns if columns is not None else MetadataColumns(self.fields, {}, count)
        return merged, lambda wanted: order[np.searchsorted(positions[order], wanted)]


class ShardedHubness:
    """What the coordinator needs of a fitted correction: its parameters (coefficients) and each bias column's
    largest value over every shard (the tmm floor)."""

    def __init__(self, params: HubnessParams, max_bias: dict[str, float]):
        self.correction = HubnessCorrection(params, {}, {})
        self.max_bias = max_bias

    def score_floor(self, coef: np.ndarray) -> float:
        return score_floor(coef, self.max_bias)


class ShardedPipeline(SearchPipeline):
    """SearchPipeline over shards: the legs are answered by the shards and merged; the rest is the base class's."""

    def __init__(  # noqa: PLR0913
        self,
        shards: ShardGroup[ShardClient],
        embedder: Any,
        defaults: SearchSpec,
        hubness: ShardedHubness | None,
        metadata: ShardedColumns | None,
        consistency: Callable[[str | None, bool, list[str]], Consistency],
        reranker: Reranker | None = None,
        fields: bool = False,
        positions_of: Callable[[Sequence[str]], list[int | None]] | None = None,
        analyzer: Analyzer | None = None,
    ):
        """`consistency(query, fields, variants)`: what each shard request carries besides the search (after writes: the
        sequence numbers the shards must have caught up with and, for `query`'s BM25 leg, the corpus statistics of its
        terms and its typos' `variants`; weighing fields, those statistics always). `fields`: every shard keeps its
        titles' term frequencies.
        `positions_of`: as SearchPipeline's, from the shards; `analyzer`: the index's, which typos' variants follow."""
        self.shards, self.consistency, self.fields, self.analyzer = shards, consistency, fields, analyzer or Analyzer()
        super().__init__(
            None, None, embedder, None, defaults, hubness=hubness, reranker=reranker, metadata=metadata, positions_of=positions_of
        )

    def check_group_by(self, value: object, path: str = "group_by") -> None:
        """Groups need every candidate's field values, which the shards hold: not on a sharded index."""
        if value is not None:
            raise SpecError(path, "a sharded index does not group hits: search it without group_by")
        return None

    def allowed(self, filter_: dict | None) -> ShardFilter | None:
        if filter_ is None:
            return None
        self._admitted(filter_)  # raises the SpecError one index would (no filterable field, a bad condition)
        return ShardFilter(filter_)

    def _request(  # noqa: PLR0913
        self,
        query: str,
        depth: int,
        allowed: ShardFilter | None,
        bm25: bool,
        vector: np.ndarray | None = None,
        hubness: HubnessSpec | None = None,
        coef: np.ndarray | None = None,
        text_fields: dict[str, float] | None = None,
        typo: str | int | Variants = 0,
    ) -> ShardSearchRequest:
        """`bm25`: the request runs a BM25 leg, which scores with the corpus statistics of the query's terms and of its
        typos' variants (chosen here for the whole index: `variants`)."""
        variants = self.variants(query, typo) if bm25 else {}
        extra = sorted({variant for found in variants.values() for variant, _ in found})
        return ShardSearchRequest(
            query,
            depth,
            allowed.filter if allowed is not None else None,
            vector,
            hubness.method if hubness is not None else "none",
            coef,
            self.consistency(query if bm25 else None, text_fields is not None, extra),
            text_fields if bm25 else None,
            allowed.excluded if allowed is not None else None,
            variants or None,
        )

    def variants(self, query: str, typo: str | int | Variants) -> Variants:
        """The variants one index would match `query`'s typos to, from what every shard holds (search.typo.TypoTerms):
        one round to the shards, as they may each hold some of a variant's documents."""
        if isinstance(typo, dict) or typo == 0:
            return typo if isinstance(typo, dict) else {}
        min_seq = self.consistency(None, False, []).min_seq
        parts = self.shards.all(lambda shard: shard.typo_terms(query, typo, min_seq))
        return TypoTerms.merged(parts).variants(self.analyzer, query, typo)

    def typo_variants(self, query: str, spec: SearchSpec) -> dict[str, list[dict[str, Any]]]:
        if spec.mode == "dense" or spec.typo == 0:
            return {}
        return {term: [{"term": v, "edits": d} for v, d in found] for term, found in self.variants(query, spec.typo).items()}

    def _check_text_fields(self, spec: SearchSpec) -> None:
        if not self.fields:
            raise SpecError("text_fields", "a shard of this index keeps no title frequencies (split before fields): split it again")

    def hide(self, allowed: ShardFilter | None, hidden: np.ndarray) -> ShardFilter | None:  # type: ignore[override]
        """The shards leave `hidden` out as they evaluate the filter."""
        if not len(hidden):
            return allowed
        return ShardFilter(allowed.filter if allowed is not None else None, hidden)

    def admitted_pins(self, pins: np.ndarray, allowed: ShardFilter | None) -> np.ndarray:  # type: ignore[override]
        """The pins the filter admits, as the shards holding them say (hidden ones are no pins: Placed.of)."""
        if allowed is None or allowed.filter is None or not len(pins):
            return pins
        filter_, min_seq = allowed.filter, self.metadata.min_seq() if isinstance(self.metadata, ShardedColumns) else ()
        admitted = self.shards.all(lambda shard: shard.admits(filter_, pins, min_seq))
        return pins[np.isin(pins, np.concatenate(admitted))]

    def bm25_leg(
        self,
        query: str,
        depth: int,
        clock: Stopwatch,
        allowed: ShardFilter | None = None,
        scoring: PassageSpec | None = None,
        typo: str | int | Variants = 0,
        text_fields: dict[str, float] | None = None,
    ) -> tuple[None, Ranking]:
        request = self._request(query, depth, allowed, True, text_fields=text_fields, typo=typo)
        answers: list[ShardRanking] = clock.time("bm25", self.shards.all, lambda shard: shard.search("bm25", request))
        return None, merge_top(answers, depth)

    def coefficients(self, vector: np.ndarray, hubness: HubnessSpec) -> np.ndarray | None:
        """The bias coefficients for this query: a dynamic variant's banks apply by the whole corpus's raw top-1."""
        if hubness.method == "none":
            return None
        correction = self.hubness.correction
        if not hubness.dynamic:
            return correction.coefficients(hubness.method, False, None)
        tops = [top for top in self.shards.all(lambda shard: shard.raw_top1(vector)) if top is not None]
        if not tops:
            return correction.coefficients_for(hubness.method, False, False)
        best = min(tops, key=lambda top: (-top.score, top.position))
        return correction.coefficients_for(hubness.method, best.query, best.gallery)

    def dense_leg(
        self,
        query: str,
        depth: int,
        clock: Stopwatch,
        hubness: HubnessSpec,
        allowed: ShardFilter | None = None,
        vector: np.ndarray | None = None,
        coef: np.ndarray | None = None,
        scoring: PassageSpec | None = None,  # a sharded index has no passages (indexer.shards.split refuses them)
    ) -> tuple[np.ndarray, Ranking, np.ndarray | None]:
        if vector is None:
            vector = clock.time("embed", self.embedder.encode, [query])[0]
        coef = self.coefficients(vector, hubness) if coef is None else coef
        request = self._request(query, depth, allowed, False, vector, hubness, coef)
        answers: list[ShardRanking] = clock.time("dense", self.shards.all, lambda shard: shard.search("dense", request))
        return vector, merge_top(answers, depth), coef

    def candidates(  # noqa: PLR0913
        self,
        query: str,
        depth: int,
        hubness: HubnessSpec = HubnessSpec(),
        clock: Stopwatch | None = None,
        allowed: ShardFilter | None = None,
        vector: np.ndarray | None = None,
        coef: np.ndarray | None = None,
        scoring: PassageSpec | None = None,
        typo: str | int | Variants = 0,
        text_fields: dict[str, float] | None = None,
    ) -> tuple[Candidates, np.ndarray]:
        clock = clock or Stopwatch()
        if vector is None:
            vector = clock.time("embed", self.embedder.encode, [query])[0]
        coef = self.coefficients(vector, hubness) if coef is None else coef
        request = self._request(query, depth, allowed, True, vector, hubness, coef, text_fields, typo)
        answers: list[ShardCandidates] = clock.time("shards", self.shards.all, lambda shard: shard.candidates(request))
        floors = {"dense": self.hubness.score_floor(coef)} if coef is not None else None
        return clock.time("candidates", merge_candidates, answers, depth, floors), vector
