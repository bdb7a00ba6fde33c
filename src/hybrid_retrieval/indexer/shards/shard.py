"""One shard's side of a sharded index: its searches, answered in the whole index's numbering (positions), and its
writes when it is a writer (a ShardSearcher: what search.sharded.ShardClient names).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hybrid_retrieval.common.errors import HybridError
from hybrid_retrieval.indexer import store
from hybrid_retrieval.indexer.live.collection import Collection
from hybrid_retrieval.indexer.live.view import ReadView
from hybrid_retrieval.indexer.manifest import IndexOpenError
from hybrid_retrieval.indexer.shards.layout import POSITIONS, base_positions
from hybrid_retrieval.search.pipeline import SearchPipeline, Stopwatch
from hybrid_retrieval.search.segments import CorpusStatistics, LiveBM25, LiveSegment
from hybrid_retrieval.search.spec import HubnessSpec


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

    def local(self, positions) -> tuple[np.ndarray, np.ndarray]:
        """The local number of each of `positions`, and whether this shard holds it."""
        positions = np.asarray(positions, dtype=np.int64)
        if not len(self.positions):
            return np.zeros(len(positions), dtype=np.int64), np.zeros(len(positions), dtype=bool)
        local = np.minimum(np.searchsorted(self.positions, positions), len(self.positions) - 1)
        return local, self.positions[local] == positions

    def document(self, local: int) -> dict:
        return self.read_view.document(local) if self.read_view is not None else self.index.docs.get(local)


class ShardSearcher:
    """One shard's half of a sharded search (search.sharded.ShardClient), over an opened shard folder, and the shard's
    writes when it has a `collection` (indexer.live: the writer's, or a follower's that `follow` keeps up with the
    writer's log). Answers use the whole index's numbering (positions); everything passed in and out is plain data,
    so it can cross processes."""

    def __init__(self, index: store.OpenIndex, collection: Collection | None = None):
        if index.manifest.shard is None:
            raise IndexOpenError(f"{index.path} is not a shard (its manifest has no shard section)")
        self.index, self.collection = index, collection
        if collection is not None:
            collection.on_compact = _keep_positions
        self._base = (index, base_positions(index))
        self._view = _ShardView.of(index, collection.view if collection is not None else None, self._base[1])

    def view(self, min_seq: list[int] | int = 0) -> _ShardView:
        """The current view, after catching up with the writer's log when it is older than `min_seq` (a follower;
        a list: by shard, this shard's entry)."""
        collection = self.collection
        if collection is None:
            return self._view
        if isinstance(min_seq, list):
            min_seq = min_seq[self.index.manifest.shard["index"]]
        read_view = collection.view
        if read_view.seq < min_seq:
            read_view = collection.follow(up_to=min_seq) if collection.seq < min_seq else collection.refresh()
        view = self._view
        if view.key is not read_view:
            if self._base[0] is not read_view.index:  # a compaction's new base: read its positions once, as it opens
                self._base = (read_view.index, base_positions(read_view.index))
            view = self._view = _ShardView.of(read_view.index, read_view, self._base[1])
        return view

    def describe(self) -> dict:
        if self.collection is not None:  # what it applied, published: a coordinator numbers new writes after them
            self.collection.refresh()
        view = self.view()
        hubness = view.index.hubness
        written = view.index.manifest.applied_sequence > 0 or (self.collection is not None and self.collection.seq > 0)
        return {
            "shard": view.index.manifest.shard,
            "created_at": view.index.manifest.created_at,
            "documents_alive": view.read_view.documents if view.read_view is not None else view.index.num_docs,
            "positions": view.positions,
            "written": written,
            "seq": self.collection.seq if self.collection is not None else 0,
            "max_bias": hubness.correction.max_bias if hubness is not None else None,
        }

    @staticmethod
    def _global(view: _ShardView, ranking) -> dict:
        return {"positions": view.positions[ranking.doc_idx], "scores": ranking.scores}

    def search(self, request: dict) -> dict:
        """One leg (mode bm25 or dense: its local top-`depth`), or both (hybrid: the local candidates, each with both
        scores, and each leg's local list) of the documents the request's filter admits. BM25 scores with the
        request's corpus statistics when it has them (a sharded index that took writes)."""
        view, clock = self.view(request.get("min_seq", 0)), Stopwatch()
        pipe = view.pipeline
        if request.get("statistics") is not None:
            pipe = pipe.with_bm25(view.bm25.with_statistics(request["statistics"]))
        allowed = pipe.allowed(request["filter"])
        query, depth, coef = request["query"], request["depth"], request["coef"]
        hubness = HubnessSpec(method=request.get("hubness", "none"))
        if request["mode"] == "bm25":
            return self._global(view, pipe.bm25_leg(query, depth, clock, allowed)[1])
        if request["mode"] == "dense":
            return self._global(view, pipe.dense_leg(query, depth, clock, hubness, allowed, request["vector"], coef)[1])
        candidates, _ = pipe.candidates(query, depth, hubness, clock, allowed, request["vector"], coef)
        legs = {leg: self._global(view, ranking) for leg, ranking in candidates.rankings.items()}
        return {"positions": view.positions[candidates.doc_idx], "scores": candidates.scores, **legs}

    def statistics(self, terms: list[str], min_seq: list[int] | int = 0) -> CorpusStatistics:
        """This shard's part of the corpus statistics (search.segments.CorpusStatistics)."""
        return self.view(min_seq).bm25.statistics(terms)

    def raw_top1(self, vector: np.ndarray) -> dict | None:
        view = self.view()
        top = view.index.hubness.raw_top1(vector, view.index.embeddings)
        if top is None:
            return None
        activation = view.index.hubness.correction.activation
        return {
            "position": int(view.positions[top[0]]),
            "score": top[1],
            **{bank: bool(activation[bank][top[0]]) for bank in ("query", "gallery")},
        }

    def documents(self, positions, min_seq: list[int] | int = 0) -> list[dict | None]:
        """The stored documents at `positions`; None for a position this shard does not hold."""
        view = self.view(min_seq)
        local, held = view.local(positions)
        return [view.document(int(i)) if h else None for i, h in zip(local, held)]

    def document_by_id(self, doc_id: str) -> dict | None:
        """The latest acknowledged version of a document (read-your-writes, before any refresh)."""
        return self.collection.get(doc_id) if self.collection is not None else self.index.document_by_id(doc_id)

    def facet_counts(self, names: list[str], positions, min_seq: list[int] | int = 0) -> dict[str, list]:
        """Facet counts over the documents at `positions` that this shard holds."""
        view = self.view(min_seq)
        local, held = view.local(positions)
        local = local[held]
        metadata = view.read_view.metadata if view.read_view is not None else view.index.metadata
        return {name: metadata.columns[name].counts(local) for name in names}

    # writes (the shard's writer)

    def upsert(self, documents: list[dict], positions: list[int]) -> int:
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

    def stats(self) -> dict:
        return self._writer().stats()

    def field_types(self) -> dict:
        return self._writer().field_types()

    def _writer(self) -> Collection:
        if self.collection is None:
            raise HybridError(f"{self.index.path} was opened read-only")
        return self.collection

    def close(self) -> None:
        if self.collection is not None:
            self.collection.close()
        (self.collection.index if self.collection is not None else self.index).close()


def _keep_positions(state: ReadView, manifest, folder: Path) -> None:
    """A shard's compaction keeps each document's position in the whole index (alive base documents in order, then
    live ones, as the compacted base numbers them) and its shard section."""
    base = base_positions(state.index)[state.base_alive]
    np.save(folder / POSITIONS, np.concatenate([base, np.array([doc.position for doc in state.live.docs], dtype=np.int64)]))
    manifest.files[POSITIONS] = {"bytes": (folder / POSITIONS).stat().st_size, "sha256": store.sha256_file(folder / POSITIONS)}
    manifest.shard = state.index.manifest.shard
