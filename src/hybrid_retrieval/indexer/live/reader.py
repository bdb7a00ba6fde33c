"""The reader of a live collection: the read view searches use, made from the writer's state and published by
`refresh` (one at a time, under the refresh lock), waited for by `wait_visible` (the visible condition), and kept up
with another process's log by `follow` (a replica of a shard that a writer elsewhere takes writes for).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from hybrid_retrieval.indexer.live.compaction import reopen
from hybrid_retrieval.indexer.live.log import log_path
from hybrid_retrieval.indexer.live.replay import replay_records
from hybrid_retrieval.indexer.live.view import ReadView
from hybrid_retrieval.indexer.live.writer import Writer
from hybrid_retrieval.indexer.manifest import read_manifest
from hybrid_retrieval.indexer.wal import WriteAheadLog


class Reader:
    """`on_refresh(view)` is called before a new read view counts as visible (the service swaps its searches to it
    there)."""

    def __init__(self, writer: Writer, on_refresh: Callable[[ReadView], None] | None = None):
        self.writer, self.on_refresh = writer, on_refresh
        self._refresh_lock = threading.Lock()
        self._visible = threading.Condition()
        self.view = writer.state.freeze()

    def refresh(self) -> ReadView:
        """Publish the writes applied so far to searches (a no-op when nothing changed). One refresh at a time (the
        refresher, `?wait=true` writes, compaction): an older view is never published over a newer one."""
        with self._refresh_lock:
            with self.writer.lock:
                state = self.writer.state
                if not state.dirty:
                    return self.view
                state.dirty = False
                view = state.freeze()
            if self.on_refresh is not None:
                self.on_refresh(view)
            with self._visible:
                self.view = view  # one reference assignment: searches see the old or the new view
                self._visible.notify_all()
            return view

    def wait_visible(self, seq: int, timeout: float) -> bool:
        """Block until a view at `seq` or later is searchable (True), or `timeout` seconds pass (False)."""
        deadline = time.monotonic() + timeout
        with self._visible:
            while self.view.seq < seq:
                left = deadline - time.monotonic()
                if left <= 0 or not self._visible.wait(left):
                    return self.view.seq >= seq
        return True

    def follow(self, up_to: int | None = None) -> ReadView:
        """Apply and publish what another process logged since, up to sequence number `up_to` (None: all of it). When
        that writer compacted (the manifest on disk names another base, or the log skips a sequence number: it was
        cut), the index is opened again first."""
        with self.writer.lock:
            state = self.writer.state
            for _ in range(3):  # a compaction may swap the folder between the reads: look again
                on_disk = read_manifest(state.index.path)
                if (on_disk.created_at, on_disk.applied_sequence) != (
                    state.index.manifest.created_at,
                    state.index.manifest.applied_sequence,
                ):
                    fresh = reopen(state.index)  # start over on the base the writer published; its log is applied next
                    state.start(fresh, fresh.manifest.applied_sequence)
                    state.dirty = True
                records = [
                    r
                    for r in WriteAheadLog.replay(log_path(state.index.path))  # a torn tail: in progress
                    if r["seq"] > state.seq and (up_to is None or r["seq"] <= up_to)
                ]
                if not records or records[0]["seq"] == state.seq + 1:
                    replay_records(state, records)  # the documents analysed on the old base are not analysed again
                    break
            state.forget_previous()
        return self.refresh()
