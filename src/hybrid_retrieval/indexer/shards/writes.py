"""Writes to a sharded index: each document routed to the shard its id hashes to, numbered in write order across
the whole index, and published to searches by a refresh of every shard.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from hybrid_retrieval.common.errors import Conflict, HybridError, StorageError
from hybrid_retrieval.indexer.live.collection import Point
from hybrid_retrieval.indexer.live.validate import check_batch, check_ids, decide_types, filterable_fields
from hybrid_retrieval.indexer.manifest import Manifest
from hybrid_retrieval.indexer.shards.coordinator import ShardedIndex
from hybrid_retrieval.indexer.shards.layout import shard_of
from hybrid_retrieval.indexer.shards.wire import ShardWriter
from hybrid_retrieval.models.cross_encoder import CrossEncoder
from hybrid_retrieval.models.embedder import Embedder
from hybrid_retrieval.search.hits import Presenter
from hybrid_retrieval.search.sharded import ShardedPipeline

P = TypeVar("P")  # a shard's part of a write


@dataclass(frozen=True)
class ShardedView:
    """What the service serves of a sharded index as of a refresh (the shards hold the documents' snapshots)."""

    index: ShardedIndex
    seq: int
    documents: int

    def pipeline(
        self,
        overrides: dict[str, Any] | None = None,
        executor: ThreadPoolExecutor | None = None,
        cross_encoder: CrossEncoder | None = None,
        cross_encoder_name: str = "",
        embedder: Embedder | None = None,
    ) -> ShardedPipeline:
        return self.index.pipeline(overrides, executor, cross_encoder, cross_encoder_name, embedder)

    def presenter(self, embedder: Embedder | None = None) -> Presenter:
        return self.index.presenter(embedder)


Parts = dict[int, tuple[list[dict[str, Any]], list[int]]]  # by shard: its documents of a batch and their positions


class ShardedCollection:
    """Writes to a sharded index (the service's collection of it): each document goes to the shard its id hashes to,
    whose writer validates, embeds and logs it durably (indexer.live), with the next position of the whole index,
    given here in write order so the shards number written documents as one index would. A batch is validated
    whole before any shard sees it; then each shard's part is durable on its own. One write at a time.

    Sequence numbers are the sum of the shards' writers' own (durable, and growing with every write); a refresh
    publishes every shard's writes, and searches then carry each shard's sequence number, so a replica that follows
    the writer's log catches up before it answers."""

    def __init__(self, index: ShardedIndex, max_batch_docs: int, on_refresh: Callable[[ShardedView], None] | None = None):
        if index.read_only_reason is not None:
            raise HybridError(index.read_only_reason)
        assert index.writers is not None  # an index without writers has a read_only_reason
        self.index, self.writers, self.max_batch_docs, self.on_refresh = index, index.writers, max_batch_docs, on_refresh
        self._lock = threading.Lock()
        self._refresh_lock = threading.Lock()
        self._compact_lock = threading.Lock()
        self._acked = list(index.visible)
        self.write_problem: str | None = None
        self.view = ShardedView(index, sum(index.visible), index.documents_count)
        # each metadata field's type, decided once for the whole index (every write passes here first): a field a
        # write adds takes its first value's type in every shard
        self._filterable = filterable_fields(index.manifest)
        self._field_types: dict[str, str | None] = {}
        for types in self.writers.all(lambda writer: writer.field_types()):
            for name, kind in types.items():
                self._field_types[name] = kind if self._field_types.get(name, kind) == kind else None

    @property
    def seq(self) -> int:
        return sum(self._acked)

    vectors = None  # a sharded index's documents bring no vectors: each shard's writer embeds its own

    @property
    def filterable(self) -> frozenset[str] | None:
        return self._filterable

    def field_types(self) -> dict[str, str | None]:
        with self._lock:
            return dict(self._field_types)

    def upsert(self, documents: list[Any]) -> int:
        types = dict(self._field_types)
        checked = check_batch(documents, self.max_batch_docs, types)
        decide_types(checked, types, self._filterable)  # fail before any shard embeds; decided again below
        owners = shard_of([doc["id"] for doc in checked], len(self.writers))
        with self._lock:
            self._field_types.update(decide_types(checked, self._field_types, self._filterable))
            positions = np.arange(self.index.next_position, self.index.next_position + len(checked))
            parts: Parts = {
                int(s): ([checked[i] for i in np.flatnonzero(owners == s)], positions[owners == s].tolist()) for s in np.unique(owners)
            }
            self.index.next_position += len(checked)  # positions of a failed batch stay unused: only order matters
            return self._write(lambda writer, part: writer.upsert(*part), parts)

    def delete(self, ids: list[Any]) -> int:
        ids = check_ids(ids)
        owners = shard_of(ids, len(self.writers))
        with self._lock:
            parts = {int(s): [ids[i] for i in np.flatnonzero(owners == s)] for s in np.unique(owners)}
            return self._write(lambda writer, part: writer.delete(part), parts)

    def _write(self, write: Callable[[ShardWriter, P], int], parts: dict[int, P]) -> int:
        """(lock held) `write(writer, part)` of each shard's part; the sequence number once all of them are durable.
        When one fails, the parts the other shards logged stay (each shard's part is all or nothing) and are published."""
        self.index.written = True  # from now on BM25 legs sum the shards' statistics
        try:
            for shard, seq in self.writers.some(write, parts).items():
                self._acked[shard] = seq
        except Exception as exc:
            self._acked = [stats.last_sequence for stats in self.writers.all(lambda writer: writer.stats())]
            if isinstance(exc, StorageError):
                self.write_problem = str(exc)
            raise
        self.write_problem = None
        return self.seq

    def storage_problem(self) -> str | None:
        """Why the last write could not be logged by every shard (None: it was)."""
        return self.write_problem

    def get(self, doc_id: str) -> dict[str, Any] | None:
        return self.writers.clients[self.index.owner_of(doc_id)].document_by_id(doc_id)

    def refresh(self) -> ShardedView:
        """Publish every shard's acknowledged writes; one refresh at a time, so visibility never goes back."""
        with self._refresh_lock:
            with self._lock:
                acked = list(self._acked)
            if acked == self.index.visible and self.view.seq == sum(acked):
                return self.view
            self.writers.all(lambda writer: writer.refresh())
            self.index.visible = acked
            stats = self.writers.all(lambda writer: writer.stats())
            view = ShardedView(self.index, sum(acked), sum(s.documents for s in stats))
            if self.on_refresh is not None:
                self.on_refresh(view)
            self.view = view
            return view

    def wait_visible(self, seq: int, timeout: float) -> bool:
        return self.view.seq >= seq  # a refresh publishes every shard at once: nothing to wait for after it

    def needs_compaction(self, fraction: float, min_docs: int) -> bool:
        return any(self.writers.all(lambda writer: writer.needs_compaction(fraction, min_docs)))

    @property
    def compacting(self) -> bool:
        return self._compact_lock.locked()

    def compact(self) -> ShardedView:
        """Compact every shard that changed (each in place, atomically, while writes continue)."""
        with self._compact_lock:
            self.writers.all(lambda writer: writer.compact())
        return self.refresh()

    def stats(self) -> dict[str, int]:
        parts = self.writers.all(lambda writer: writer.stats())
        return {
            "documents": sum(part.documents for part in parts),
            "base_documents": sum(part.base_documents for part in parts),
            "deleted_base_documents": sum(part.deleted_base_documents for part in parts),
            "live_documents": sum(part.live_documents for part in parts),
            "last_sequence": self.seq,
            "visible_sequence": self.view.seq,
        }

    def frozen(self) -> AbstractContextManager[Point]:
        """Refused: a snapshot holds one folder, and a sharded collection's documents are in its shards' folders."""
        raise Conflict("a sharded collection is snapshotted offline, shard by shard (`hybrid snapshot create` on each shard's folder)")

    def update_manifest(self, change: Callable[[Manifest], None]) -> None:
        """Refused: each shard's manifest holds the defaults it was split with."""
        raise Conflict("a sharded collection's defaults are those it was split with: change them in the whole index and split it again")

    def close(self, reason: str = "this collection is closed") -> None:
        """Release the shards' logs this process writes (a reload's new collection takes them over); on Ray the
        writer deployments keep theirs."""
        for searcher in self.index.own:
            if searcher.collection is not None:
                searcher.collection.close(reason)
