"""What a coordinator asks of a shard besides searching (search.sharded.ShardClient), and of the shard's writer: the
protocols a shard in process (ShardSearcher) and over Ray Serve (cluster.serve.RemoteShard) both implement, and the
frozen dataclasses of plain data they answer with (they cross processes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from hybrid_retrieval.search.sharded import MinSeq, ShardClient


@dataclass(frozen=True)
class ShardDescription:
    """What a shard is (shard `index` of `shards`) and holds, as of its writer's last write (`seq`)."""

    index: int
    shards: int
    documents_alive: int
    positions: np.ndarray  # each document's position in the whole index, ascending
    written: bool  # it took a write since the split
    seq: int
    max_bias: dict[str, float] | None  # each hubness bias column's largest value (None: no fitted correction)
    fields: bool = False  # it keeps its titles' term frequencies (search.fields)


@dataclass(frozen=True)
class ShardStats:
    """A shard's writer's counts (indexer.live.collection.Collection.stats)."""

    documents: int
    base_documents: int
    deleted_base_documents: int
    live_documents: int
    last_sequence: int


class ShardReader(ShardClient, Protocol):
    """A shard as the coordinator's index reads it: what searches ask, and its documents."""

    def describe(self) -> ShardDescription: ...
    def documents(self, positions: np.ndarray, min_seq: MinSeq = ()) -> list[dict[str, Any] | None]: ...
    def document_by_id(self, doc_id: str) -> dict[str, Any] | None: ...


class ShardWriter(ShardReader, Protocol):
    """A shard's writer: its reads, and the writes indexer.shards.writes.ShardedCollection routes to it."""

    def upsert(self, documents: list[dict[str, Any]], positions: list[int]) -> int: ...
    def delete(self, ids: list[str]) -> int: ...
    def refresh(self) -> int: ...
    def needs_compaction(self, fraction: float, min_docs: int) -> bool: ...
    def compact(self) -> int: ...
    def stats(self) -> ShardStats: ...
    def field_types(self) -> dict[str, str | None]: ...
