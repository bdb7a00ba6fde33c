"""Compaction of a live collection and its policy: when the live segment and the deletions have outgrown the base,
they are merged into a new base segment, published atomically in place of the index folder while writes continue.
The compaction lock lets one compaction (or a frozen point, or a settings change) run at a time; the steps are
indexer.live.compaction's.
"""

from __future__ import annotations

import logging
import threading

from hybrid_retrieval.common.memory import release_free_memory
from hybrid_retrieval.common.publish import publish_dir, scratch_dir
from hybrid_retrieval.indexer.leftovers import remove_leftovers
from hybrid_retrieval.indexer.live.compaction import OnCompact, build_compacted, current_corpus, current_vectors, link_log, reopen
from hybrid_retrieval.indexer.live.fence import Closed
from hybrid_retrieval.indexer.live.reader import Reader
from hybrid_retrieval.indexer.live.view import ReadView
from hybrid_retrieval.indexer.live.writer import Writer
from hybrid_retrieval.indexer.store import folder_identity

logger = logging.getLogger(__name__)


class Compactor:
    """`on_compact(state, manifest, folder)`: what else a compaction writes into the new base folder before its
    manifest (a shard's positions)."""

    def __init__(self, writer: Writer, reader: Reader):
        self.writer, self.reader = writer, reader
        self.on_compact: OnCompact | None = None
        self.lock = threading.Lock()

    @property
    def compacting(self) -> bool:
        return self.lock.locked()

    def needs_compaction(self, fraction: float, min_docs: int) -> bool:
        """Whether the live segment and the deletions have grown past `fraction` of the base (and `min_docs`)."""
        state = self.writer.state
        changed = len(state.live) + int((~state.base_alive).sum())
        return changed >= max(min_docs, fraction * len(state.base_alive))

    def compact(self) -> ReadView:
        """Merge the live segment and the deletions into a new base; rankings do not change (the same documents, the
        same statistics). The log moves into the new folder (hard link) before the swap, and the new manifest records
        the last sequence it holds, so a crash at any point leaves the old or the new base with every write. A
        collection closed before the swap (dropped, restored over) publishes nothing: Closed, with the reason."""
        writer = self.writer
        with self.lock:
            with writer.lock:
                if writer.closed is not None:  # its folder may be another collection's by now (a restore over it)
                    raise Closed(writer.closed)
                writer.refuse_if_replaced()
                state = writer.state.freeze()
                writer.logged_since = []
            try:
                if not state.live.docs and state.base_alive.all():
                    return self.reader.refresh()  # nothing to merge
                self._build_and_swap(state)
            finally:
                with writer.lock:
                    writer.logged_since = None
            # under the lock: the next compaction's scratch folder, made and then locked, is not a leftover yet
            remove_leftovers(state.index.path)
        logger.info("compacted %s: %d documents up to sequence %d", state.index.path, self.reader.view.documents, state.seq)
        view = self.reader.refresh()
        del state  # the old base and live documents, once no search holds them
        release_free_memory()
        return view

    def _build_and_swap(self, state: ReadView) -> None:
        """(compaction lock held) Build the new base of `state` beside the folder and publish it in its place, the
        write lock held across the swap: no write may fall between the two folders."""
        writer, path = self.writer, state.index.path
        with scratch_dir(path) as work:
            corpus = current_corpus(state.index, state.base_alive, state.live.docs, work)
            vectors = current_vectors(state.index, state.base_alive, state.live.docs, work)
            held = False
            try:
                with publish_dir(path) as tmp:
                    build_compacted(state, corpus, vectors, tmp, self.on_compact, checkpoint=self._stop_if_closed)
                    writer.lock.acquire()
                    held = True
                    if writer.closed is not None:  # dropped or restored over while it built: the folder is not ours
                        raise Closed(writer.closed)
                    writer.refuse_if_replaced()  # another process published its folder there meanwhile
                    link_log(path, tmp)
                try:
                    fresh = reopen(state.index)
                except BaseException:  # the folder is this collection's own new base, whose log is the one it holds
                    state.index.folder_id = folder_identity(path)
                    raise
                writer.continue_on(fresh, state.seq)
            finally:
                if held:
                    writer.lock.release()

    def _stop_if_closed(self) -> None:
        """Between a compaction's stages: a collection closed meanwhile (dropped, restored over, reloaded) takes no
        new base, so the build stops here instead of finishing first (close() waits for it). Read without the lock:
        the swap checks again under it."""
        if self.writer.closed is not None:
            raise Closed(self.writer.closed)
