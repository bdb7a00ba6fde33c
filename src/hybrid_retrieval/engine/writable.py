"""What the engine drives of a collection that takes writes, whole (indexer.live.collection.Collection) or sharded
(indexer.shards.writes.ShardedCollection): one protocol, so the service never asks which it holds."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Protocol

from hybrid_retrieval.indexer.live.collection import Point
from hybrid_retrieval.indexer.live.validate import VectorRule
from hybrid_retrieval.indexer.live.view import ReadView
from hybrid_retrieval.indexer.manifest import Manifest
from hybrid_retrieval.indexer.shards.writes import ShardedView


class WritableCollection(Protocol):
    """Writes are acknowledged with a sequence number once durable, and become searchable at the next `refresh`."""

    @property
    def vectors(self) -> VectorRule | None:
        """What vectors written documents may bring (None: none)."""
        ...

    @property
    def view(self) -> ReadView | ShardedView:
        """What searches read now."""
        ...

    @property
    def seq(self) -> int: ...

    @property
    def filterable(self) -> frozenset[str] | None: ...

    @property
    def compacting(self) -> bool: ...

    def field_types(self) -> dict[str, str | None]: ...

    def upsert(self, documents: list[Any]) -> int: ...

    def delete(self, ids: list[Any]) -> int: ...

    def get(self, doc_id: str) -> dict[str, Any] | None: ...

    def refresh(self) -> object: ...

    def wait_visible(self, seq: int, timeout: float) -> bool: ...

    def storage_problem(self) -> str | None: ...

    def needs_compaction(self, fraction: float, min_docs: int) -> bool: ...

    def compact(self) -> object: ...

    def stats(self) -> dict[str, int]: ...

    def frozen(self) -> AbstractContextManager[Point]:
        """Hold the collection's files still for a snapshot (Unsupported where it cannot be copied online)."""
        ...

    def update_manifest(self, change: Callable[[Manifest], None]) -> None: ...

    def close(self, reason: str = ...) -> None: ...
