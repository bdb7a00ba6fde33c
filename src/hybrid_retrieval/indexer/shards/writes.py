"""Writes to a sharded index: each document routed to the shard its id hashes to, numbered in write order across
the whole index, and published to searches by a refresh of every shard.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from hybrid_retrieval.common.errors import HybridError, StorageError
from hybrid_retrieval.indexer.live.validate import check_batch, check_ids, decide_types, filterable_fields
from hybrid_retrieval.indexer.shards.coordinator import ShardedIndex
from hybrid_retrieval.indexer.shards.layout import shard_of


@dataclass(frozen=True)
class ShardedView:
    """What the service serves of a sharded index as of a refresh (the shards hold the documents' snapshots)."""

    index: ShardedIndex
    seq: int
    documents: int

    def pipeline(self, *args, **kwargs):
        return self.index.pipeline(*args, **kwargs)

    def presenter(self, embedder=None):
        return self.index.presenter(embedder)


class ShardedCollection:
    """Writes to a sharded index (the service's collection of it): each document goes to the shard its id hashes to,
    whose writer validates, embeds and logs it durably (indexer.live), with the next position of the whole index,
    given here in write order so the shards number written documents as one index would. A batch is validated
    whole before any shard sees it; then each shard's part is durable on its own. One write at a time.

    Sequence numbers are the sum of the shards' writers' own (durable, and growing with every write); a refresh
    publishes every shard's writes, and searches then carry each shard's sequence number, so a replica that follows
    the writer's log catches up before it answers."""

    def __init__(self, index: ShardedIndex, max_batch_docs: int, on_refresh=None):
        if index.read_only_reason is not None:
            raise HybridError(index.read_only_reason)
        self.index, self.max_batch_docs, self.on_refresh = index, max_batch_docs, on_refresh
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
        for types in index.writers.all("field_types"):
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

    def upsert(self, documents: list) -> int:
        types = dict(self._field_types)
        checked = check_batch(documents, self.max_batch_docs, types)
        decide_types(checked, types, self._filterable)  # fail before any shard embeds; decided again below
        owners = shard_of([doc["id"] for doc in checked], len(self.index.shards))
        with self._lock:
            self._field_types.update(decide_types(checked, self._field_types, self._filterable))
            positions = np.arange(self.index.next_position, self.index.next_position + len(checked))
            parts = {
                int(s): ([checked[i] for i in np.flatnonzero(owners == s)], positions[owners == s].tolist()) for s in np.unique(owners)
            }
            self.index.next_position += len(checked)  # positions of a failed batch stay unused: only order matters
            return self._write("upsert", parts)

    def delete(self, ids: list) -> int:
        ids = check_ids(ids)
        owners = shard_of(ids, len(self.index.shards))
        with self._lock:
            return self._write("delete", {int(s): ([ids[i] for i in np.flatnonzero(owners == s)],) for s in np.unique(owners)})

    def _write(self, method: str, parts: dict[int, tuple]) -> int:
        """(lock held) Each shard's part to its writer; the sequence number once all of them are durable. When one
        fails, the parts the other shards logged stay (each shard's part is all or nothing) and are published."""
        self.index.written = True  # from now on BM25 legs sum the shards' statistics
        try:
            for shard, seq in self.index.writers.some(method, parts).items():
                self._acked[shard] = seq
        except Exception as exc:
            self._acked = [int(stats["last_sequence"]) for stats in self.index.writers.all("stats")]
            if isinstance(exc, StorageError):
                self.write_problem = str(exc)
            raise
        self.write_problem = None
        return self.seq

    def storage_problem(self) -> str | None:
        """Why the last write could not be logged by every shard (None: it was)."""
        return self.write_problem

    def get(self, doc_id: str) -> dict | None:
        return self.index.writers.clients[self.index.owner_of(doc_id)].document_by_id(doc_id)

    def refresh(self) -> ShardedView:
        """Publish every shard's acknowledged writes; one refresh at a time, so visibility never goes back."""
        with self._refresh_lock:
            with self._lock:
                acked = list(self._acked)
            if acked == self.index.visible and self.view.seq == sum(acked):
                return self.view
            self.index.writers.all("refresh")
            self.index.visible = acked
            stats = self.index.writers.all("stats")
            view = ShardedView(self.index, sum(acked), sum(s["documents"] for s in stats))
            if self.on_refresh is not None:
                self.on_refresh(view)
            self.view = view
            return view

    def wait_visible(self, seq: int, timeout: float) -> bool:
        return self.view.seq >= seq  # a refresh publishes every shard at once: nothing to wait for after it

    def needs_compaction(self, fraction: float, min_docs: int) -> bool:
        return any(self.index.writers.all("needs_compaction", fraction, min_docs))

    @property
    def compacting(self) -> bool:
        return self._compact_lock.locked()

    def compact(self) -> ShardedView:
        """Compact every shard that changed (each in place, atomically, while writes continue)."""
        with self._compact_lock:
            self.index.writers.all("compact")
        return self.refresh()

    def stats(self) -> dict:
        parts = self.index.writers.all("stats")
        totals = {
            key: sum(part[key] for part in parts) for key in ("documents", "base_documents", "deleted_base_documents", "live_documents")
        }
        return {**totals, "last_sequence": self.seq, "visible_sequence": self.view.seq}

    def close(self, reason: str = "this collection is closed") -> None:
        """Release the shards' logs this process writes (a reload's new collection takes them over); on Ray the
        writer deployments keep theirs."""
        for writer in self.index.writers.clients:
            collection = getattr(writer, "collection", None)
            if collection is not None:
                collection.close(reason)
