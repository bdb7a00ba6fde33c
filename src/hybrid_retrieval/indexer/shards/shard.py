"""One shard's side of a sharded index: its searches, answered in the whole index's numbering (positions), and its
writes when it is a writer (a ShardSearcher: what indexer.shards.wire.ShardWriter names).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hybrid_retrieval.common.errors import HybridError
from hybrid_retrieval.indexer import store
from hybrid_retrieval.indexer.live.collection import Collection
from hybrid_retrieval.indexer.live.view import ReadView
from hybrid_retrieval.indexer.manifest import IndexOpenError, Manifest
from hybrid_retrieval.indexer.shards.layout import POSITIONS, base_positions
from hybrid_retrieval.indexer.shards.wire import ShardDescription, ShardStats
from hybrid_retrieval.search.curation import without
from hybrid_retrieval.search.filters.language import Allowed
from hybrid_retrieval.search.pipeline import SearchPipeline, Stopwatch
from hybrid_retrieval.search.ranking import Ranking
from hybrid_retrieval.search.segments import CorpusStatistics, LiveBM25, LiveSegment
from hybrid_retrieval.search.sharded import FieldColumns, Leg, MinSeq, ShardCandidates, ShardRanking, ShardSearchRequest, ShardTop1
from hybrid_retrieval.search.spec import HubnessSpec
from hybrid_retrieval.search.typo import TypoTerms


@dataclass(frozen=True)
class _ShardView:
    """What a shard's searches read, as of one read view: its pipeline, and the position of each document (base then
    live numbering)."""

    key: object  # the read view (or the index, for a shard without a collection) this view was made of
    index: store.OpenIndex
    read_view: ReadView | None
    pipeline: SearchPipeline
    positions: np.ndarray

    @classmethod
    def of(cls, index: store.OpenIndex, read_view: ReadView | None, positions: np.ndarray) -> _ShardView:
        """`positions`: the base documents' (base_positions)."""
        if read_view is None:
            return cls(index, index, None, index.pipeline(), positions)
        live = np.array([doc.position for doc in read_view.live.docs], dtype=np.int64)
        # fusion, rerank and the defaults are the coordinator's: a shard only runs legs
        return cls(read_view, index, read_view, read_view.pipeline(), np.concatenate([positions, live]))

    @functools.cached_property
    def bm25(self) -> LiveBM25:
        """BM25 over the documents that exist, to score with the whole corpus's statistics (a changed read view's
        pipeline already has it)."""
        if isinstance(self.pipeline.bm25, LiveBM25):
            return self.pipeline.bm25
        read_view = self.read_view
        alive = read_view.base_alive if read_view is not None else np.ones(self.index.num_docs, dtype=bool)
        live = read_view.live if read_view is not None else LiveSegment([], self.index.dense.dimension, {})
        return LiveBM25(self.index.bm25, self.index.postings, self.index.manifest.bm25, alive, live)

    def ranking(self, ranking: Ranking) -> ShardRanking:
        return ShardRanking(self.positions[ranking.doc_idx], ranking.scores)

    def local(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The local number of each of `positions`, and whether this shard holds it."""
        positions = np.asarray(positions, dtype=np.int64)
        if not len(self.positions):
            return np.zeros(len(positions), dtype=np.int64), np.zeros(len(positions), dtype=bool)
        local = np.minimum(np.searchsorted(self.positions, positions), len(self.positions) - 1)
        return local, self.positions[local] == positions

    def document(self, local: int) -> dict[str, Any] | None:
        return self.read_view.document(local) if self.read_view is not None else self.index.docs.get(local)


class ShardSearcher:
    """One shard's half of a sharded search (indexer.shards.wire.ShardWriter), over an opened shard folder, and the
    shard's writes when it has a `collection` (indexer.live: the writer's, or a follower's that `follow` keeps up with
    the writer's log). Answers use the whole index's numbering (positions); everything passed in and out is plain
    data, so it can cross processes."""

    def __init__(self, index: store.OpenIndex, collection: Collection | None = None):
        if index.manifest.shard is None:
            raise IndexOpenError(f"{index.path} is not a shard (its manifest has no shard section)")
        self.index, self.collection, self.shard = index, collection, index.manifest.shard
        if collection is not None:
            collection.on_compact = _keep_positions
        self._base = (index, base_positions(index))
        self._view = _ShardView.of(index, collection.view if collection is not None else None, self._base[1])

    def view(self, min_seq: MinSeq = ()) -> _ShardView:
        """The current view, after catching up with the writer's log when it is older than this shard's `min_seq`
        (a follower)."""
        collection = self.collection
        if collection is None:
            return self._view
        seq = min_seq[self.shard["index"]] if min_seq else 0
        read_view = collection.view
        if read_view.seq < seq:
            read_view = collection.follow(up_to=seq) if collection.seq < seq else collection.refresh()
        view = self._view
        if view.key is not read_view:
            if self._base[0] is not read_view.index:  # a compaction's new base: read its positions once, as it opens
                self._base = (read_view.index, base_positions(read_view.index))
            view = self._view = _ShardView.of(read_view.index, read_view, self._base[1])
        return view

    def describe(self) -> ShardDescription:
        if self.collection is not None:  # what it applied, published: a coordinator numbers new writes after them
            self.collection.refresh()
        view = self.view()
        hubness = view.index.hubness
        seq = self.collection.seq if self.collection is not None else 0
        return ShardDescription(
            index=self.shard["index"],
            shards=self.shard["shards"],
            documents_alive=view.read_view.documents if view.read_view is not None else view.index.num_docs,
            positions=view.positions,
            written=view.index.manifest.applied_sequence > 0 or seq > 0,
            seq=seq,
            max_bias=hubness.correction.max_bias if hubness is not None else None,
            fields=view.bm25.has_fields,
        )

    def _searching(self, request: ShardSearchRequest) -> tuple[_ShardView, SearchPipeline, Allowed | None]:
        """The view a request reads, its pipeline (BM25 scoring with the request's corpus statistics when it has
        them: a sharded index that took writes), and the documents its filter admits."""
        view = self.view(request.consistency.min_seq)
        pipe = view.pipeline
        if request.consistency.statistics is not None:
            pipe = pipe.with_bm25(view.bm25.with_statistics(request.consistency.statistics))
        allowed = pipe.allowed(request.filter)
        if request.excluded is not None:  # curation's hidden documents
            local, held = view.local(request.excluded)
            allowed = without(allowed, local[held], pipe.num_docs)
        return view, pipe, allowed

    def search(self, leg: Leg, request: ShardSearchRequest) -> ShardRanking:
        """One leg's local top-`depth` of the documents the request's filter admits."""
        view, pipe, allowed = self._searching(request)
        if leg == "bm25":
            typo = request.variants or 0
            return view.ranking(pipe.bm25_leg(request.query, request.depth, Stopwatch(), allowed, None, typo, request.text_fields)[1])
        hubness = HubnessSpec(method=request.hubness)
        return view.ranking(pipe.dense_leg(request.query, request.depth, Stopwatch(), hubness, allowed, request.vector, request.coef)[1])

    def candidates(self, request: ShardSearchRequest) -> ShardCandidates:
        """Both legs: the local candidates, each with both scores, and each leg's local list."""
        view, pipe, allowed = self._searching(request)
        hubness = HubnessSpec(method=request.hubness)
        candidates, _ = pipe.candidates(
            request.query,
            request.depth,
            hubness,
            Stopwatch(),
            allowed,
            request.vector,
            request.coef,
            typo=request.variants or 0,
            text_fields=request.text_fields,
        )
        assert candidates.rankings is not None  # Candidates.from_rankings keeps them
        rankings = {leg: view.ranking(ranking) for leg, ranking in candidates.rankings.items()}
        return ShardCandidates(view.positions[candidates.doc_idx], candidates.scores, rankings)

    def statistics(self, terms: list[str], min_seq: MinSeq = ()) -> CorpusStatistics:
        """This shard's part of the corpus statistics (search.segments.CorpusStatistics)."""
        return self.view(min_seq).bm25.statistics(terms)

    def raw_top1(self, vector: np.ndarray) -> ShardTop1 | None:
        view = self.view()
        hubness = view.index.hubness
        assert hubness is not None  # asked only with a dynamic hubness variant, which the coordinator checked it has
        top = hubness.raw_top1(vector, view.index.embeddings)
        if top is None:
            return None
        activation = hubness.correction.activation
        return ShardTop1(int(view.positions[top[0]]), top[1], bool(activation["query"][top[0]]), bool(activation["gallery"][top[0]]))

    def documents(self, positions: np.ndarray, min_seq: MinSeq = ()) -> list[dict[str, Any] | None]:
        """The stored documents at `positions`; None for a position this shard does not hold."""
        view = self.view(min_seq)
        local, held = view.local(positions)
        return [view.document(int(i)) if h else None for i, h in zip(local, held)]

    def document_by_id(self, doc_id: str) -> dict[str, Any] | None:
        """The latest acknowledged version of a document (read-your-writes, before any refresh)."""
        return self.collection.get(doc_id) if self.collection is not None else self.index.document_by_id(doc_id)

    def facet_counts(self, names: list[str], positions: np.ndarray, min_seq: MinSeq = ()) -> dict[str, list[tuple[Any, int]]]:
        """Facet counts over the documents at `positions` that this shard holds."""
        view = self.view(min_seq)
        local, held = view.local(positions)
        local = local[held]
        metadata = view.read_view.metadata if view.read_view is not None else view.index.metadata
        assert metadata is not None  # asked only of an index with filterable fields, which every shard holds
        return {name: metadata.columns[name].counts(local) for name in names}

    def typo_terms(self, query: str, typo: str | int, min_seq: MinSeq = ()) -> TypoTerms:
        """This shard's part of what `query`'s typos may be matched to (search.typo.TypoTerms)."""
        return self.view(min_seq).bm25.typo_terms(query, typo)

    def positions_of(self, ids: list[str], min_seq: MinSeq = ()) -> list[int | None]:
        """The position of each document of `ids` this shard holds (None: not held here, or deleted)."""
        view = self.view(min_seq)
        local = view.read_view.positions_of(ids) if view.read_view is not None else view.index.positions_of(ids)
        return [int(view.positions[at]) if at is not None else None for at in local]

    def admits(self, filter_: dict[str, Any], positions: np.ndarray, min_seq: MinSeq = ()) -> np.ndarray:
        """Those of `positions` this shard holds and `filter_` admits."""
        view = self.view(min_seq)
        local, held = view.local(positions)
        allowed = view.pipeline.allowed(filter_)
        kept = held.copy() if allowed is None else held & allowed.mask[np.where(held, local, 0)]
        return np.asarray(positions, dtype=np.int64)[kept]

    def field_columns(self, positions: np.ndarray, min_seq: MinSeq = ()) -> FieldColumns:
        """The documents at `positions` that this shard holds (in that order), and their filterable fields' values
        (for boosts and sorts: search.sharded.ShardedColumns.for_docs)."""
        view = self.view(min_seq)
        local, held = view.local(positions)
        metadata = view.read_view.metadata if view.read_view is not None else view.index.metadata
        kept = np.asarray(positions, dtype=np.int64)[held]
        if metadata is None:
            return FieldColumns(kept, {}, {})
        return FieldColumns(kept, metadata.fields, metadata.take(local[held]).columns)

    # writes (the shard's writer)

    def upsert(self, documents: list[dict[str, Any]], positions: list[int]) -> int:
        """Written documents keep the order they were written in: their positions follow every one this shard holds."""
        collection = self._writer()
        self.view()  # the base as published (a compaction's new one)
        last = max(int(np.max(self._base[1], initial=-1)), collection.last_position)
        if len(positions) and min(positions) <= last:
            raise HybridError(f"positions must follow the last one this shard holds ({last}), got {min(positions)}")
        return collection.upsert(documents, positions)

    def delete(self, ids: list[str]) -> int:
        return self._writer().delete(ids)

    def refresh(self) -> int:
        return self._writer().refresh().seq

    def needs_compaction(self, fraction: float, min_docs: int) -> bool:
        return self._writer().needs_compaction(fraction, min_docs)

    def compact(self) -> int:
        return self._writer().compact().seq

    def stats(self) -> ShardStats:
        stats = self._writer().stats()
        return ShardStats(
            stats["documents"], stats["base_documents"], stats["deleted_base_documents"], stats["live_documents"], stats["last_sequence"]
        )

    def field_types(self) -> dict[str, str | None]:
        return self._writer().field_types()

    def _writer(self) -> Collection:
        if self.collection is None:
            raise HybridError(f"{self.index.path} was opened read-only")
        return self.collection

    def close(self) -> None:
        if self.collection is not None:
            self.collection.close()
        (self.collection.index if self.collection is not None else self.index).close()


def _keep_positions(state: ReadView, manifest: Manifest, folder: Path) -> None:
    """A shard's compaction keeps each document's position in the whole index (alive base documents in order, then
    live ones, as the compacted base numbers them) and its shard section."""
    base = base_positions(state.index)[state.base_alive]
    np.save(folder / POSITIONS, np.concatenate([base, np.array([doc.position for doc in state.live.docs], dtype=np.int64)]))
    manifest.files[POSITIONS] = {"bytes": (folder / POSITIONS).stat().st_size, "sha256": store.sha256_file(folder / POSITIONS)}
    manifest.shard = state.index.manifest.shard
