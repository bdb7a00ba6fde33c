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

`ShardClient` is what a shard answers (indexer.shards.ShardSearcher in process, a Ray Serve deployment across
machines: cluster.serve); a `ShardGroup` calls all of them at once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from hybrid_retrieval.common.errors import SpecError
from hybrid_retrieval.search.filters.columns import KeywordColumn, MetadataColumns, ValueColumn
from hybrid_retrieval.search.fusion import RETRIEVERS, Candidates
from hybrid_retrieval.search.hubness import HubnessCorrection, HubnessParams, score_floor
from hybrid_retrieval.search.pipeline import SearchPipeline, Stopwatch
from hybrid_retrieval.search.ranking import Ranking
from hybrid_retrieval.search.rerank import Reranker
from hybrid_retrieval.search.spec import HubnessSpec, PassageSpec, SearchSpec


class ShardClient(Protocol):
    """`min_seq`: by shard, the writer sequence number a shard must have caught up with before it answers."""

    def describe(self) -> dict: ...
    def search(self, request: dict) -> dict: ...
    def statistics(self, terms: list[str], min_seq: list[int] | int = 0): ...
    def raw_top1(self, vector: np.ndarray) -> dict | None: ...
    def documents(self, positions: np.ndarray, min_seq: list[int] | int = 0) -> list[dict | None]: ...
    def facet_counts(self, names: list[str], positions: np.ndarray, min_seq: list[int] | int = 0) -> dict[str, list]: ...


class ShardGroup:
    """Calls a method of every shard at once and returns their answers in shard order."""

    def __init__(self, clients: Sequence[ShardClient], executor: ThreadPoolExecutor | None = None):
        self.clients = list(clients)
        self._executor = executor or ThreadPoolExecutor(max(1, len(self.clients)), thread_name_prefix="shard")

    def __len__(self) -> int:
        return len(self.clients)

    def all(self, method: str, *args) -> list:
        return list(self.some(method, {i: args for i in range(len(self.clients))}).values())

    def some(self, method: str, args_by_shard: dict[int, tuple]) -> dict[int, object]:
        """Every call is finished before an error is raised: nothing keeps running behind it (a write's other parts)."""
        futures = {i: self._executor.submit(getattr(self.clients[i], method), *args) for i, args in args_by_shard.items()}
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


def merge_top(parts: Sequence[tuple[np.ndarray, np.ndarray]], depth: int) -> Ranking:
    """The best `depth` of the shards' (positions, scores) lists: by score, ties by lower position (as search.ranking.top_k)."""
    if not parts:
        return Ranking.empty()
    positions = np.concatenate([np.asarray(p, dtype=np.int64) for p, _ in parts])
    scores = np.concatenate([np.asarray(s) for _, s in parts])
    order = np.lexsort((positions, -scores))[:depth]
    return Ranking(positions[order], scores[order])


def merge_candidates(parts: Sequence[dict], depth: int, floors: dict[str, float] | None) -> Candidates:
    """The global candidates from each shard's: each leg's global top-`depth` of the shards' leg lists, every member
    with both raw scores as its shard computed them."""
    rankings = {leg: merge_top([(p[leg]["positions"], p[leg]["scores"]) for p in parts], depth) for leg in RETRIEVERS}
    positions = np.concatenate([np.asarray(p["positions"], dtype=np.int64) for p in parts])
    order = np.argsort(positions, kind="stable")
    positions = positions[order]
    known = {leg: np.concatenate([np.asarray(p["scores"][leg], dtype=np.float64) for p in parts])[order] for leg in RETRIEVERS}

    def score_of(leg: str) -> Callable[[np.ndarray], np.ndarray]:
        return lambda idx: known[leg][np.searchsorted(positions, idx)]

    return Candidates.from_rankings(rankings, {leg: score_of(leg) for leg in RETRIEVERS}, floors)


@dataclass(frozen=True)
class ShardFilter:
    """A checked filter, evaluated by each shard over its own documents."""

    filter: dict


class ShardedColumns(MetadataColumns):
    """The coordinator's view of the metadata: filters are checked here (the fields' types are known: an empty
    column of each type evaluates a filter over no document and raises the same errors) and evaluated by the shards;
    facets are counted by the shards holding the hits and added up."""

    def __init__(self, fields: dict, shards: ShardGroup, owner: Callable[[np.ndarray], np.ndarray], consistency: Callable[[], dict] = dict):
        empty = {
            name: KeywordColumn([], np.zeros(1, np.int64), np.empty(0, np.int32))
            if info.type == "keyword"
            else ValueColumn(np.empty(0, {"bool": np.bool_, "int": np.int64}.get(info.type, np.float64)), np.empty(0, bool))
            for name, info in fields.items()
            if info.filterable
        }
        super().__init__(fields, empty, 0)
        self.shards, self.owner, self.consistency = shards, owner, consistency

    def facets(self, names: Sequence[str], docs: np.ndarray, size: int) -> dict[str, list[dict]]:
        min_seq = self.consistency().get("min_seq", 0)
        asked = by_owner(self.owner(docs), docs, len(self.shards))
        answers = self.shards.some("facet_counts", {i: (list(names), part, min_seq) for i, part in asked.items()})
        out = {}
        for name in names:
            totals: dict = {}
            for counts in answers.values():
                for value, count in counts[name]:
                    totals[value] = totals.get(value, 0) + count
            pairs = sorted(totals.items())  # value order, then by count (stable), as MetadataColumns.facets
            pairs.sort(key=lambda pair: -pair[1])
            out[name] = [{"value": value, "count": count} for value, count in pairs[:size]]
        return out


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

    def __init__(
        self,
        shards: ShardGroup,
        embedder,
        defaults: SearchSpec,
        hubness: ShardedHubness | None,
        metadata: ShardedColumns | None,
        reranker: Reranker | None = None,
        consistency: Callable[[str | None], dict] = lambda query=None: {},
    ):
        """`consistency(query)`: what each shard request carries besides the leg (after writes: the sequence numbers
        the shards must have caught up with and, for `query`'s BM25 leg, the corpus statistics of its terms)."""
        self.shards, self.consistency = shards, consistency
        super().__init__(None, None, embedder, None, defaults, hubness=hubness, reranker=reranker, metadata=metadata)

    def check_group_by(self, value: object, path: str = "group_by") -> None:
        """Groups need every candidate's field values, which the shards hold: not on a sharded index."""
        if value is not None:
            raise SpecError(path, "a sharded index does not group hits: search it without group_by")
        return None

    def allowed(self, filter_: dict | None) -> ShardFilter | None:
        if filter_ is None:
            return None
        return self._shard_filter(filter_)

    def _shard_filter(self, filter_: dict) -> ShardFilter:
        self._admitted(filter_)  # raises the SpecError one index would (no filterable field, a bad condition)
        return ShardFilter(filter_)

    def _request(
        self, mode: str, query: str, depth: int, allowed: ShardFilter | None, vector=None, hubness: HubnessSpec | None = None, coef=None
    ) -> dict:
        return {
            "mode": mode,
            "query": query,
            "depth": depth,
            "filter": allowed.filter if allowed is not None else None,
            "vector": vector,
            "hubness": hubness.method if hubness is not None else "none",
            "coef": coef,
            **self.consistency(query if mode != "dense" else None),
        }

    def bm25_leg(self, query: str, depth: int, clock: Stopwatch, allowed: ShardFilter | None = None, scoring: PassageSpec | None = None):
        answers = clock.time("bm25", self.shards.all, "search", self._request("bm25", query, depth, allowed))
        return None, merge_top([(a["positions"], a["scores"]) for a in answers], depth)

    def coefficients(self, vector: np.ndarray, hubness: HubnessSpec) -> np.ndarray | None:
        """The bias coefficients for this query: a dynamic variant's banks apply by the whole corpus's raw top-1."""
        if hubness.method == "none":
            return None
        correction = self.hubness.correction
        if not hubness.dynamic:
            return correction.coefficients(hubness.method, False, None)
        tops = [top for top in self.shards.all("raw_top1", vector) if top is not None]
        if not tops:
            return correction.coefficients_for(hubness.method, False, False)
        best = min(tops, key=lambda top: (-top["score"], top["position"]))
        return correction.coefficients_for(hubness.method, best["query"], best["gallery"])

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
    ):
        if vector is None:
            vector = clock.time("embed", self.embedder.encode, [query])[0]
        coef = self.coefficients(vector, hubness) if coef is None else coef
        request = self._request("dense", query, depth, allowed, vector, hubness, coef)
        answers = clock.time("dense", self.shards.all, "search", request)
        return vector, merge_top([(a["positions"], a["scores"]) for a in answers], depth), coef

    def candidates(
        self,
        query: str,
        depth: int,
        hubness: HubnessSpec = HubnessSpec(),
        clock: Stopwatch | None = None,
        allowed: ShardFilter | None = None,
        vector: np.ndarray | None = None,
        coef: np.ndarray | None = None,
        scoring: PassageSpec | None = None,
    ) -> tuple[Candidates, np.ndarray]:
        clock = clock or Stopwatch()
        if vector is None:
            vector = clock.time("embed", self.embedder.encode, [query])[0]
        coef = self.coefficients(vector, hubness) if coef is None else coef
        answers = clock.time("shards", self.shards.all, "search", self._request("hybrid", query, depth, allowed, vector, hubness, coef))
        floors = {"dense": self.hubness.score_floor(coef)} if coef is not None else None
        return clock.time("candidates", merge_candidates, answers, depth, floors), vector
