"""The search pipeline: retrieve with BM25 and/or dense, fuse, rerank; return a ranking with timings
and the spec it applied."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hybrid_retrieval.common.errors import SpecError
from hybrid_retrieval.search import budget, checks
from hybrid_retrieval.search.bm25 import BM25Index
from hybrid_retrieval.search.boosts import Boosted, apply_boosts, check_fields
from hybrid_retrieval.search.curation import Curation, Placed, pin, without
from hybrid_retrieval.search.dense import DenseIndex, exact_top_k
from hybrid_retrieval.search.fields import weights_of
from hybrid_retrieval.search.filters.columns import MetadataColumns
from hybrid_retrieval.search.filters.language import Allowed
from hybrid_retrieval.search.fusion import Candidates, Fused, fuse
from hybrid_retrieval.search.grouping import GroupBy, Groups, check_group_by, group
from hybrid_retrieval.search.highlight import check_semantic_hits
from hybrid_retrieval.search.hubness import HubnessSearcher
from hybrid_retrieval.search.passages import PassageIndex
from hybrid_retrieval.search.ranking import Ranking
from hybrid_retrieval.search.rerank import Reranked, Reranker
from hybrid_retrieval.search.segments import CorpusScoredBM25, LiveBM25, LiveDense, LiveVectors
from hybrid_retrieval.search.sorting import check_sort_fields, sort_ranking
from hybrid_retrieval.search.spec import HubnessSpec, PassageSpec, SearchSpec, check_k
from hybrid_retrieval.search.typo import Variants

MAX_OFFSET = 10_000


def check_offset(offset) -> int:
    """How many hits a page skips (not part of the spec, like k)."""
    return checks.number("offset", offset, 0, MAX_OFFSET, integer=True)


@dataclass(frozen=True)
class Query:
    """One search of a batch (`SearchPipeline.search_many`)."""

    text: str | None
    k: int = 10
    spec: SearchSpec | dict | None = None
    offset: int = 0
    vector: np.ndarray | None = None  # the query's own embedding (search.vectors.check_vector), when the caller has one
    group_by: GroupBy | None = None  # collapse hits by a keyword field (search.grouping; checked by check_group_by)
    curation: Curation | None = None  # documents pinned first or hidden (search.curation)


@dataclass
class SearchResult:
    ranking: Ranking  # the hits up to offset + k, best first; the page is ranking[offset:]
    spec: SearchSpec  # the spec applied
    timings_ms: dict[str, float] = field(default_factory=dict)
    fused: Fused | None = None  # hybrid only: candidates with every component, for `explain`
    reranked: Reranked | None = None
    offset: int = 0
    has_more: bool = False  # hits exist below this page
    pool: np.ndarray | None = None  # every hit a page could show (filtered, above min_score): for facets
    allowed: Allowed | None = None  # the documents the filter admits (None: no filter)
    vector: np.ndarray | None = None  # the query embedding, when a stage computed one
    groups: Groups | None = None  # with group_by: each hit's group, by position in `ranking`
    boosted: Boosted | None = None  # with boosts: each candidate's score before them and their contributions
    pinned: tuple[int, ...] = ()  # the curated pins `ranking` starts with (search.curation), in order

    @property
    def page(self) -> range:
        """Positions in `ranking` of this page's hits."""
        return range(self.offset, len(self.ranking))

    @property
    def explainable(self) -> bool:
        return self.fused is not None or self.reranked is not None or self.boosted is not None or bool(self.pinned)

    def explain(self, position: int) -> dict:
        """Every component of the score of the hit at `position` (hybrid, reranked, boosted or pinned): the final
        score is the fused (or reranked, or retriever's) score plus each boost's contribution."""
        score = float(self.ranking.scores[position])
        parts: dict = {"final": None if np.isnan(score) else score}
        doc = int(self.ranking.doc_idx[position])
        if doc in self.pinned:
            parts["pinned"] = self.pinned.index(doc) + 1
        boosted = self.boosted.explain(doc, self.spec.boosts) if self.boosted is not None else None
        if boosted is not None:
            parts["boosted"] = {"mode": self.spec.boost_mode, **boosted}
        elif self.boosted is not None:  # a pin that was no candidate: it has no score to explain
            return parts
        reranked = self.reranked
        if reranked is not None:  # looked up by document: min_score and groups leave out some of the reranked
            found = np.flatnonzero(reranked.ranking.doc_idx == doc)
            if not len(found):  # a pin from outside the candidates
                return parts
            at = int(found[0])
            parts["rerank"] = {
                "score": float(reranked.rerank_score[at]) if at < reranked.depth else None,
                "weight": reranked.weight,
                "first_stage_rank": int(reranked.first_stage_rank[at]),
                "first_stage_score": float(reranked.first_stage_score[at]),
            }
        if self.fused is not None:
            parts.update(self._fused_parts(doc))
        return parts

    def _fused_parts(self, doc: int) -> dict:
        fused = self.fused
        at = int(np.searchsorted(fused.candidates.doc_idx, doc))
        if at == len(fused.candidates.doc_idx) or fused.candidates.doc_idx[at] != doc:  # a pin from outside them
            return {}
        parts = {}
        for name in ("bm25", "dense"):
            rank = int(fused.candidates.ranks[name][at])
            parts[name] = {
                "score": float(fused.candidates.scores[name][at]),
                "rank": rank or None,
                "normalized": None if fused.normalized is None else float(fused.normalized[name][at]),
                "contribution": float(fused.contributions[name][at]),
            }
        return {"fused": float(fused.scores[at]), **parts}


def check_query(query: str | None, vector: np.ndarray | None, spec: SearchSpec) -> None:
    """A search's text: required unless a `vector` drives a dense search without reranking or highlights."""
    if query is None and vector is not None:
        needs = {"bm25 and hybrid modes (BM25 reads it)": spec.mode != "dense", "reranking": spec.rerank.enabled}
        needs["highlights"] = spec.highlight.enabled
        for what, needed in needs.items():
            if needed:
                raise SpecError("query", f"{what} need the query text: send it beside the vector")
        return
    if not isinstance(query, str) or not query.strip():
        raise SpecError("query", "must be a non-empty string (or leave it out and send a `vector` for a dense search)")


class Stopwatch:
    def __init__(self):
        self.timings: dict[str, float] = {}

    def time(self, stage: str, fn, *args):
        start = time.perf_counter()
        result = fn(*args)
        self.timings[stage] = (time.perf_counter() - start) * 1000
        return result


class SearchPipeline:
    """Stateless over shared, read-only indexes: safe to call from many threads at once.

    `defaults` is the spec a request's partial spec is merged onto (see search.spec). Hybrid mode fuses
    the top-`depth` of each retriever, independent of `k`, so a document's fused score never depends
    on the page size. With an executor, the BM25 leg runs beside query embedding + dense search.
    """

    def __init__(  # noqa: PLR0913
        self,
        bm25: BM25Index | LiveBM25,
        dense: DenseIndex | LiveDense,
        embedder,
        embeddings: np.ndarray | LiveVectors,
        defaults: SearchSpec = SearchSpec(),
        executor: ThreadPoolExecutor | None = None,
        hubness: HubnessSearcher | None = None,
        reranker: Reranker | None = None,
        metadata: MetadataColumns | None = None,
        alive: np.ndarray | None = None,
        no_hubness_reason: str = "this index has no fitted hubness correction (run `hybrid hubness fit`)",
        passages: PassageIndex | None = None,
        positions_of: Callable[[Sequence[str]], list[int | None]] | None = None,
        fielded: Callable[[], LiveBM25 | CorpusScoredBM25 | None] | None = None,
    ):
        """`positions_of(ids)`: each document's position (None: no such document, or deleted), for curation;
        `fielded()`: BM25 from term frequencies, which weighs title and text (search.fields), when `bm25` cannot."""
        self.bm25, self.dense, self.embedder, self.embeddings = bm25, dense, embedder, embeddings
        self.passages = passages  # a chunked index: the dense leg ranks documents by their passages
        self.executor, self.hubness, self.reranker, self.metadata = executor, hubness, reranker, metadata
        self.alive = Allowed(alive) if alive is not None else None  # documents not deleted (None: all of them)
        self.no_hubness_reason = no_hubness_reason
        self.positions_of = positions_of
        self._fielded: Callable[[], LiveBM25 | CorpusScoredBM25 | None] | None = fielded
        if fielded is None and isinstance(bm25, LiveBM25):
            self._fielded = lambda: bm25
        self.defaults = self._servable(defaults)

    @property
    def num_docs(self) -> int:
        """Documents in the numbering, deleted ones included."""
        return len(self.embeddings)

    def with_bm25(self, bm25) -> SearchPipeline:
        """This pipeline with another BM25 scorer (a shard's, scoring with its whole corpus's statistics)."""
        clone = copy.copy(self)
        clone.bm25 = bm25
        clone._fielded = lambda: bm25  # fields are scored with its statistics too
        return clone

    def resolve(self, overrides: dict | None = None) -> SearchSpec:
        """The defaults with a request's partial spec merged on, checked against what this index can do."""
        return self._servable(self.defaults.merge(overrides))

    def _servable(self, spec: SearchSpec) -> SearchSpec:
        if spec.hubness.method != "none" and self.passages is not None:
            raise SpecError("hubness.method", 'this index ranks documents by passages, which no hubness correction covers; use "none"')
        if spec.passage_scoring.bm25 == "passages" and (self.passages is None or self.passages.lexical is None):
            why = "this index is not chunked into passages" if self.passages is None else "this index keeps no BM25 of its passages"
            raise SpecError("passage_scoring.bm25", f'{why}: use "document"')
        if spec.hubness.method != "none" and self.hubness is None:
            raise SpecError("hubness.method", f'{self.no_hubness_reason}; use "none"')
        if spec.rerank.enabled and self.reranker is None:
            raise SpecError(
                "rerank.enabled", "no reranker is configured (the service's HYBRID_RERANKER, `hybrid search --reranker`); use false"
            )
        if spec.filter is not None:
            self._admitted(spec.filter)  # checks the filter against the index's fields (the answer is cached)
        check_fields(spec.boosts, self.metadata)
        check_sort_fields(spec.sort, self.metadata)
        if spec.text_fields is not None and spec.mode != "dense":
            self._check_text_fields(spec)
        return spec

    def _check_text_fields(self, spec: SearchSpec) -> None:
        if spec.passage_scoring.bm25 == "passages":
            raise SpecError("text_fields", 'passages are scored as one field: use passage_scoring.bm25 "document" to weigh fields')
        fielded = self._fielded() if self._fielded is not None else None
        if fielded is None or not fielded.has_fields:
            raise SpecError(
                "text_fields",
                "this index keeps no title frequencies (built before fields, or with a BM25 method other than lucene): "
                "compact it (POST /admin/compact) or rebuild it to weigh title and text",
            )

    def _admitted(self, filter_: dict) -> Allowed:
        if self.metadata is None:
            raise SpecError(
                "filter",
                "this index has no filterable metadata fields (documents had no metadata, or `hybrid index --filterable` named none)",
            )
        return self.metadata.allowed(filter_)

    def allowed(self, filter_: dict | None) -> Allowed | None:
        """The documents `filter_` admits that exist (None: every document); SpecError naming the path of a bad
        condition."""
        if filter_ is None:
            return self.alive
        allowed = self._admitted(filter_)
        return allowed if self.alive is None else Allowed(allowed.mask & self.alive.mask)

    def placed(self, curation: Curation | None) -> Placed | None:
        """`curation`'s documents by position (None: nothing curated)."""
        if not curation:
            return None
        self.check_curation("pinned" if curation.pinned else "hidden")
        assert self.positions_of is not None  # check_curation
        return Placed.of(curation, self.positions_of)

    def hide(self, allowed: Allowed | None, hidden: np.ndarray) -> Allowed | None:
        """What `allowed` admits (None: every document) but `hidden`."""
        return without(allowed, hidden, self.num_docs)

    def admitted_pins(self, pins: np.ndarray, allowed: Allowed | None) -> np.ndarray:
        """The `pins` that `allowed` admits, in order."""
        return pins if allowed is None else pins[allowed.mask[pins]]

    def check_curation(self, path: str) -> None:
        """SpecError under `path` when this index cannot pin or hide documents."""
        if self.positions_of is None:
            raise SpecError(path, "this index cannot pin or hide documents by id")

    def check_group_by(self, value: object, path: str = "group_by") -> GroupBy | None:
        """A request's group_by, checked against this index's keyword fields."""
        return check_group_by(value, self.metadata, path)

    def bm25_leg(
        self,
        query: str,
        depth: int,
        clock: Stopwatch,
        allowed: Allowed | None = None,
        scoring: PassageSpec | None = None,
        typo: str | int | Variants = 0,
        text_fields: dict[str, float] | None = None,
    ):
        """(the query's BM25 score of any documents, the top `depth` of the allowed ones): of the whole document, or in
        a chunked index of its best passage when `scoring` (default: the defaults') says so; `typo`: search.typo;
        `text_fields`: title and text weighted as BM25F fields (search.fields)."""
        scoring = scoring or self.defaults.passage_scoring
        if text_fields is not None:
            fielded, weights = self._fielded() if self._fielded is not None else None, weights_of(text_fields)
            assert fielded is not None  # _check_text_fields
            ranking, score_of = clock.time("bm25", lambda: fielded.leg(query, depth, allowed, typo=typo, fields=weights))
            return score_of, ranking
        bm25 = self.passages.lexical if scoring.bm25 == "passages" and self.passages is not None else self.bm25
        ranking, score_of = clock.time("bm25", lambda: bm25.leg(query, depth, allowed, typo=typo))
        return score_of, ranking

    def typo_variants(self, query: str, spec: SearchSpec) -> dict[str, list[dict[str, Any]]]:
        """The terms the BM25 leg matches each query term the collection does not hold to under `spec` (search.typo)."""
        if spec.mode == "dense" or spec.typo == 0:
            return {}
        scoring = spec.passage_scoring
        bm25 = self.passages.lexical if scoring.bm25 == "passages" and self.passages is not None else self.bm25
        return {term: [{"term": v, "edits": d} for v, d in found] for term, found in bm25.variants(query, spec.typo).items()}

    def dense_leg(
        self,
        query: str,
        depth: int,
        clock: Stopwatch,
        hubness: HubnessSpec,
        allowed: Allowed | None = None,
        vector: np.ndarray | None = None,
        coef: np.ndarray | None = None,
        scoring: PassageSpec | None = None,
    ):
        """(query vector, ranking, bias coefficients): corrected over the whole corpus when asked (with `coef` when the
        caller chose them: a shard's coordinator); among the allowed documents only, scored exactly when they are few
        (see DenseIndex.brute_force). A chunked index ranks documents by their passages, as `scoring` (default: the
        defaults') says."""
        if vector is None:
            vector = clock.time("embed", self.embedder.encode, [query])[0]
        if self.passages is not None:  # a chunked index has no hubness correction (training.hubness fits documents)
            scoring = scoring or self.defaults.passage_scoring
            return vector, clock.time("dense", self.passages.search, vector, depth, scoring, allowed), None
        if hubness.method != "none" and coef is not None:
            return vector, clock.time("dense", self.hubness.search_with, vector, depth, coef, allowed, self.embeddings), coef
        if hubness.method != "none":
            ranking, coef = clock.time(
                "dense", self.hubness.search, vector, depth, hubness.method, hubness.dynamic, allowed, self.embeddings
            )
            return vector, ranking, coef
        if allowed is not None and self.dense.brute_force(allowed):
            return vector, clock.time("dense", exact_top_k, lambda ids: self.embeddings[ids] @ vector, allowed.ids, depth), None
        return vector, clock.time("dense", self.dense.search, vector, depth, allowed), None

    def candidates(  # noqa: PLR0913
        self,
        query: str,
        depth: int,
        hubness: HubnessSpec = HubnessSpec(),
        clock: Stopwatch | None = None,
        allowed: Allowed | None = None,
        vector: np.ndarray | None = None,
        coef: np.ndarray | None = None,
        scoring: PassageSpec | None = None,
        typo: str | int | Variants = 0,
        text_fields: dict[str, float] | None = None,
    ) -> tuple[Candidates, np.ndarray]:
        """Union of both top-`depth` lists (of the allowed documents), every document with its BM25 score and
        (corrected) cosine, or its passages' score in a chunked index; and the query vector."""
        clock = clock or Stopwatch()
        scoring = scoring or self.defaults.passage_scoring
        if self.executor is not None:
            bm25_future = self.executor.submit(self.bm25_leg, query, depth, clock, allowed, scoring, typo, text_fields)
            vector, dense_ranking, coef = self.dense_leg(query, depth, clock, hubness, allowed, vector, coef, scoring)
            bm25_score_of, bm25_ranking = bm25_future.result()
        else:
            bm25_score_of, bm25_ranking = self.bm25_leg(query, depth, clock, allowed, scoring, typo, text_fields)
            vector, dense_ranking, coef = self.dense_leg(query, depth, clock, hubness, allowed, vector, coef, scoring)
        if self.passages is not None:
            dense_scores, floors = (lambda idx: self.passages.scores(idx, vector, scoring)), None
        elif coef is None:
            dense_scores, floors = (lambda idx: self.embeddings[idx] @ vector), None
        else:
            correction = self.hubness.correction
            dense_scores = lambda idx: correction.corrected(self.embeddings[idx] @ vector, idx, coef)
            floors = {"dense": correction.score_floor(coef)}
        candidates = clock.time(
            "candidates",
            Candidates.from_rankings,
            {"bm25": bm25_ranking, "dense": dense_ranking},
            {"bm25": bm25_score_of, "dense": dense_scores},
            floors,
        )
        return candidates, vector

    def search(
        self,
        query: str | None,
        k: int = 10,
        spec: SearchSpec | dict | None = None,
        offset: int = 0,
        vector: np.ndarray | None = None,
        group_by: GroupBy | None = None,
        curation: Curation | None = None,
    ) -> SearchResult:
        """Hits `offset` .. `offset + k` for `query` under `spec`: a full spec, or a partial one (dict form)
        merged onto the defaults. `vector` is the query's embedding when the caller has it (a batch, or an application
        that embeds its own queries: then `query` may be None for a dense search).

        Pages are consistent: hybrid fuses a fixed `depth` per retriever and reranking reorders a fixed
        `rerank.depth`, so page 2 with k=10 is ranks 11-20 of k=20 with the same scores. `min_score` applies
        to the final score: the fused (or single-retriever) score, or the reranker's (search.rerank.interpolate).
        With `group_by`, the hits and pages are groups (search.grouping), formed among at least `depth` candidates.

        Then boosts (search.boosts) add to the final score and the candidates are ranked again, a sort
        (search.sorting) orders them by fields, and a `curation` (search.curation) puts its pins first, its hidden
        documents having been left out before retrieval. With boosts or a sort, a single retriever's hits stop at
        its top `depth` too (the same candidates for every page).
        """
        spec = spec if isinstance(spec, SearchSpec) else self.resolve(spec)
        check_query(query, vector, spec)
        k, offset = check_k(k), check_offset(offset)
        check_semantic_hits(spec.highlight.semantic, k)
        started = time.perf_counter()
        clock = Stopwatch()
        allowed = clock.time("filter", self.allowed, spec.filter) if spec.filter is not None else self.alive
        placed = self.placed(curation)
        if placed is not None:
            allowed = self.hide(allowed, placed.hidden)
        rerank = spec.rerank
        # a single retriever goes down to the page's end and one more (does another page exist?), at least `depth`;
        # steered, to `depth` only: boosts and sorts reorder a fixed set of candidates
        single_depth = max(0 if spec.steered else offset + k + 1, spec.depth, rerank.depth if rerank.enabled else 0)
        if group_by is not None:  # groups need more documents than hits: as many as a group could show, at least depth
            single_depth = max(single_depth, (offset + k + 1) * group_by.size)
        ranking, fused, vector = self._retrieved(query, spec, clock, allowed, vector, single_depth)
        reranked = None
        if rerank.enabled:
            if self.passages is not None and vector is None:  # the reranker reads each document's best passage
                vector = clock.time("embed", self.embedder.encode, [query])[0]
            reranked = clock.time("rerank", self.reranker.rerank, query, ranking, rerank.depth, rerank.weight, vector)
            ranking = reranked.ranking
        ranking, boosted = self._steered(ranking, spec, clock)
        pinned: tuple[int, ...] = ()
        if placed is not None:
            ranking, pinned = pin(ranking, self.admitted_pins(placed.pinned, allowed))
        pool, groups = ranking.doc_idx, None  # facets count documents, grouped or not
        if group_by is not None:
            assert self.metadata is not None  # check_group_by found the field
            ranking, groups = clock.time("group", group, ranking, self.metadata.columns[group_by.field], group_by.size)
        clock.timings["total"] = (time.perf_counter() - started) * 1000
        return SearchResult(
            ranking.head(offset + k),
            spec,
            clock.timings,
            fused,
            reranked,
            offset=offset,
            has_more=len(ranking) > offset + k,
            pool=pool,
            allowed=allowed,
            vector=vector,
            groups=groups,
            boosted=boosted,
            pinned=pinned,
        )

    def _retrieved(
        self, query: str | None, spec: SearchSpec, clock: Stopwatch, allowed: Allowed | None, vector: np.ndarray | None, single_depth: int
    ) -> tuple[Ranking, Fused | None, np.ndarray | None]:
        """(the first stage's ranking, the fusion when hybrid, the query vector): a single retriever's top
        `single_depth`, or both retrievers' top `depth` fused."""
        if spec.mode == "bm25":
            return self.bm25_leg(query, single_depth, clock, allowed, spec.passage_scoring, spec.typo, spec.text_fields)[1], None, vector
        if spec.mode == "dense":
            vector, ranking, _ = self.dense_leg(query, single_depth, clock, spec.hubness, allowed, vector, None, spec.passage_scoring)
            return ranking, None, vector
        candidates, vector = self.candidates(
            query, spec.depth, spec.hubness, clock, allowed, vector, None, spec.passage_scoring, spec.typo, spec.text_fields
        )
        fused = clock.time("fusion", fuse, candidates, spec.fusion)
        return fused.ranking(), fused, vector

    def _steered(self, ranking: Ranking, spec: SearchSpec, clock: Stopwatch) -> tuple[Ranking, Boosted | None]:
        """`ranking` boosted (ranked again by the final score), above `min_score`, sorted: search's later stages. The
        fields' values come from the metadata columns (a sharded index's, from its shards: ShardedColumns.for_docs)."""
        boosted, columns, row_of = None, self.metadata, None
        if spec.steered and self.metadata is not None:  # a sort by _score alone needs no field
            columns, row_of = clock.time("fields", self.metadata.for_docs, ranking.doc_idx)
        if spec.boosts:
            assert columns is not None and row_of is not None  # check_fields found the boosts' fields
            rows = row_of(ranking.doc_idx)
            boosted = clock.time("boost", apply_boosts, ranking.doc_idx, ranking.scores, spec.boosts, spec.boost_mode, columns, rows)
            final = boosted.base + boosted.contributions.sum(axis=0)
            order = np.lexsort((ranking.doc_idx, -final))
            ranking = Ranking(ranking.doc_idx[order], final[order])
        if spec.min_score is not None:
            # float64: a huge min_score must not overflow a float32 cast; scores descend
            ranking = ranking.head(int(np.count_nonzero(ranking.scores.astype(np.float64) >= spec.min_score)))
        if spec.sort:
            rows = row_of(ranking.doc_idx) if row_of is not None else ranking.doc_idx
            ranking = clock.time("sort", sort_ranking, ranking, spec.sort, columns, rows)
        return ranking, boosted

    def search_many(self, queries: list[Query]) -> list[SearchResult]:
        """Several searches, their queries embedded in one model run. Every query is checked before any
        runs: an invalid one raises SpecError naming it (`searches[3].k`), and nothing is answered."""
        resolved = []
        for i, item in enumerate(queries):
            try:
                spec = item.spec if isinstance(item.spec, SearchSpec) else self.resolve(item.spec)
                check_query(item.text, item.vector, spec)
                resolved.append(
                    Query(item.text, check_k(item.k), spec, check_offset(item.offset), item.vector, item.group_by, item.curation)
                )
                check_semantic_hits(spec.highlight.semantic, resolved[-1].k)
            except SpecError as exc:
                raise exc.within(f"searches[{i}]") from None
        embed = [i for i, item in enumerate(resolved) if item.spec.mode != "bm25" and item.vector is None]
        started = time.perf_counter()
        vectors = dict(zip(embed, self.embedder.encode([resolved[i].text for i in embed]))) if embed else {}
        embed_ms = (time.perf_counter() - started) * 1000
        results = []
        for i, item in enumerate(resolved):
            budget.check("a batch of searches")
            result = self.search(item.text, item.k, item.spec, item.offset, vectors.get(i, item.vector), item.group_by, item.curation)
            if i in vectors:
                result.timings_ms["embed"] = embed_ms  # the batch's one model run
            results.append(result)
        return results
