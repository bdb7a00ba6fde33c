"""The writable collection over an opened index, wired from its parts the way Tantivy separates them: the writer
(writes checked, embedded, logged, applied: the write lock), the reader (the read view, refresh, follow: the refresh
lock and the visible condition), the compactor (merging and its policy: the compaction lock), where writes are
embedded (indexer.live.embedding) and fencing (indexer.live.fence). Lock order: compaction, then write.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from hybrid_retrieval.common.errors import HybridError
from hybrid_retrieval.indexer.live.compaction import OnCompact
from hybrid_retrieval.indexer.live.compactor import Compactor
from hybrid_retrieval.indexer.live.embedding import WriteEmbedding
from hybrid_retrieval.indexer.live.fence import replaced
from hybrid_retrieval.indexer.live.log import log_path
from hybrid_retrieval.indexer.live.reader import Reader
from hybrid_retrieval.indexer.live.replay import apply_logged, replay_records
from hybrid_retrieval.indexer.live.view import ReadView
from hybrid_retrieval.indexer.live.writer import Writer
from hybrid_retrieval.indexer.manifest import Manifest, update_manifest
from hybrid_retrieval.indexer.store import OpenIndex
from hybrid_retrieval.indexer.wal import WriteAheadLog
from hybrid_retrieval.search.segments import check_live_method

DEFAULT_MAX_BATCH_DOCS = 1000


@dataclass(frozen=True)
class Point:
    """A point in a collection's write sequence: the last acknowledged write's sequence number, the length of the log
    that holds exactly the writes up to it, and the documents that exist then."""

    seq: int
    log_bytes: int
    documents: int


def current_view(index: OpenIndex) -> OpenIndex | ReadView:
    """What a search of `index` should read: the built index with the writes its log holds (read-only: nothing is
    locked or written), or the index itself when it has no log."""
    if not log_path(index.path).exists():
        return index
    return Collection(index).view


class Collection:
    """The writable collection over an opened index: writes are logged, applied, and published by `refresh`."""

    def __init__(
        self,
        index: OpenIndex,
        max_batch_docs: int = DEFAULT_MAX_BATCH_DOCS,
        on_refresh: Callable[[ReadView], None] | None = None,
        write_threads: int | None = None,
        searching: Callable[[], bool] | None = None,
        replay: bool = True,
    ):
        """Replay the index's log (if any); nothing is written until the first write. `on_refresh`: Reader;
        `write_threads` and `searching`: WriteEmbedding."""
        index.postings  # noqa: B018  (refuse early an index that cannot take writes)
        check_live_method(index.manifest.bm25)
        self.writer = Writer(index, max_batch_docs, WriteEmbedding(lambda: self.writer.state.index, write_threads, searching))
        if replay:
            replay_records(self.writer.state, WriteAheadLog.replay(log_path(index.path)))
            if (reason := replaced(index)) is not None:  # the log read may be the new folder's
                raise HybridError(f"{reason} while it was opened: open it again")
        self.reader = Reader(self.writer, on_refresh)
        self.compactor = Compactor(self.writer, self.reader)
        # the writer's, reader's and compactor's verbs, as the service calls them
        self.upsert, self.delete, self.get, self.field_types = (
            self.writer.upsert,
            self.writer.delete,
            self.writer.get,
            self.writer.field_types,
        )
        self.storage_problem = self.writer.storage_problem
        self.refresh, self.wait_visible, self.follow = self.reader.refresh, self.reader.wait_visible, self.reader.follow
        self.compact, self.needs_compaction = self.compactor.compact, self.compactor.needs_compaction

    @property
    def index(self) -> OpenIndex:
        """The base index (a compaction's new one once it is published)."""
        return self.writer.state.index

    @property
    def view(self) -> ReadView:
        """What searches read now."""
        return self.reader.view

    @property
    def seq(self) -> int:
        """The sequence number of the last write applied."""
        return self.writer.state.seq

    @property
    def last_position(self) -> int:
        """In a shard: the largest position a written document was given."""
        return self.writer.state.last_position

    @property
    def wal_path(self) -> Path:
        return log_path(self.index.path)

    @property
    def vectors(self):
        """The rule for the vectors documents bring (None: a chunked index embeds its passages itself)."""
        return self.writer.vectors

    @property
    def filterable(self) -> frozenset[str] | None:
        """The metadata fields a write may make filterable (None: every one): validate.filterable_fields."""
        return self.writer.state.filterable

    @property
    def compacting(self) -> bool:
        return self.compactor.compacting

    @property
    def on_refresh(self) -> Callable[[ReadView], None] | None:
        return self.reader.on_refresh

    @on_refresh.setter
    def on_refresh(self, hook: Callable[[ReadView], None] | None) -> None:
        self.reader.on_refresh = hook

    @property
    def on_compact(self) -> OnCompact | None:
        return self.compactor.on_compact

    @on_compact.setter
    def on_compact(self, hook: OnCompact | None) -> None:
        self.compactor.on_compact = hook

    def apply_logged(self, record: dict) -> str | None:
        """Check a record read from the log as a write is checked, then apply it; why it cannot be applied, or None."""
        return apply_logged(self.writer.state, record)

    def update_manifest(self, change: Callable[[Manifest], None]) -> None:
        """Apply `change(manifest)` to the base's manifest on disk and in memory (what changes without a rebuild: the
        API's overrides of the defaults); never while a compaction builds the next base from the current one."""
        with self.compactor.lock:
            with self.writer.lock:
                self.writer.check_own_folder()  # its manifest would be another folder's
            update_manifest(self.index.path, change)
            change(self.index.manifest)

    def stats(self) -> dict[str, int]:
        view = self.view
        return {
            "documents": view.documents,
            "base_documents": len(view.base_alive),
            "deleted_base_documents": int((~view.base_alive).sum()),
            "live_documents": len(view.live),
            "last_sequence": self.seq,
            "visible_sequence": view.seq,
        }

    @contextlib.contextmanager
    def frozen(self) -> Iterator[Point]:
        """Hold compactions and settings changes off (never writes or searches) and yield the Point of the last
        acknowledged write: until the body ends, the base folder's files cannot change, and the log's first
        `log_bytes` bytes hold exactly the writes up to `seq` (a failed append is cut back before the lock is let go)."""
        with self.compactor.lock:
            with self.writer.lock:
                self.writer.check_own_folder()  # its files would not be those of the writes it holds
                state, log = self.writer.state, self.wal_path
                point = Point(state.seq, log.stat().st_size if log.exists() else 0, int(state.base_alive.sum()) + len(state.live))
            yield point

    def close(self, reason: str = "this collection is closed") -> None:
        """Close the log; later writes are refused with `reason` (a drop, a restore over it, shutdown). Returns once
        a compaction in progress has stopped, at the end of its current stage: it publishes nothing after this (its
        folder may be dropped or replaced)."""
        with self.writer.lock:
            self.writer.refuse(reason)
        with self.compactor.lock:
            pass
