"""The writable collection over an opened index: it takes writes (checked, embedded, logged, applied) and publishes
them to searches by `refresh`, follows another process's log, and compacts. It holds the thread policy (which lock
guards what, where writes are embedded); the steps are its sibling modules'.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hybrid_retrieval.common.errors import HybridError, StorageError
from hybrid_retrieval.common.publish import publish_dir, scratch_dir
from hybrid_retrieval.indexer.build import EMBED_BATCH
from hybrid_retrieval.indexer.chunking import Chunker, encode_passages, float32_text
from hybrid_retrieval.indexer.corpus import indexed_text
from hybrid_retrieval.indexer.leftovers import remove_leftovers
from hybrid_retrieval.indexer.live.apply import LiveState
from hybrid_retrieval.indexer.live.compaction import build_compacted, current_corpus, link_log, reopen
from hybrid_retrieval.indexer.live.log import log_path, unwritable
from hybrid_retrieval.indexer.live.replay import apply_logged, replay_records
from hybrid_retrieval.indexer.live.validate import VectorRule, check_batch, check_ids, decide_types
from hybrid_retrieval.indexer.live.view import ReadView
from hybrid_retrieval.indexer.manifest import read_manifest, update_manifest
from hybrid_retrieval.indexer.store import MODEL_DIR, OpenIndex, folder_identity
from hybrid_retrieval.indexer.wal import WriteAheadLog
from hybrid_retrieval.models.embedder import NO_MODEL, OnnxEmbedder
from hybrid_retrieval.search import budget
from hybrid_retrieval.search.live_hubness import Prepared
from hybrid_retrieval.search.segments import check_live_method

logger = logging.getLogger(__name__)

DEFAULT_MAX_BATCH_DOCS = 1000
EMBED_CHUNK = 32  # documents embedded per decision of where (all cores, or half while searches run)


class Closed(HybridError):
    """A write or compaction of a collection closed for good (dropped, or replaced by a reload or a restore): nothing
    was logged or published."""


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
        on_refresh=None,
        write_threads: int | None = None,
        searching=None,
        replay: bool = True,
    ):
        """Replay the index's log (if any); nothing is written until the first write. `on_refresh(view)` is
        called before a new read view counts as visible (the service swaps its searches to it there).

        Where written documents are embedded: with `write_threads`, always on a session of that many cores, one batch
        at a time. Otherwise on all cores (the index's own session, the fastest ingest), except while `searching()`
        says searches are running: then each chunk of a batch goes to a session on half the cores, so writes cannot
        take every core from searches (docs/BENCHMARKS.md, "Live writes", measures both)."""
        self.max_batch_docs, self.on_refresh = max_batch_docs, on_refresh
        # what else a compaction writes into the new base folder before its manifest: on_compact(state, manifest, folder)
        self.on_compact = None
        self.write_threads, self.searching = write_threads, searching
        self._write_embedder = None
        self._embed_lock = threading.Lock()
        index.postings  # noqa: B018  (refuse early an index that cannot take writes)
        check_live_method(index.manifest.bm25)
        # documents may bring their own vectors of the index's dimension; without a model, they must. A chunked index
        # embeds its documents' passages itself (indexer.chunking): its documents bring none.
        chunking = index.manifest.chunking
        self.chunker = Chunker(index.path / MODEL_DIR, chunking) if chunking.enabled else None
        no_model = index.manifest.embedder.document_backend == NO_MODEL
        self.vectors = None if self.chunker is not None else VectorRule(index.dense.dimension, required=no_model)
        self._state = LiveState(index, index.manifest.applied_sequence)
        self._write_lock = threading.Lock()  # guards the state and the log
        self._compact_lock = threading.Lock()
        self._refresh_lock = threading.Lock()
        self._visible = threading.Condition()
        self.write_problem: str | None = None  # why the last write could not be logged (cleared by the next that is)
        self._closed: str | None = None  # why writes are refused for good (close)
        if replay:
            replay_records(self._state, WriteAheadLog.replay(self.wal_path))
            if (replaced := self._replaced()) is not None:  # the log read may be the new folder's
                raise HybridError(f"{replaced} while it was opened: open it again")
        self._wal: WriteAheadLog | None = None  # opened (and the index locked for writing) by the first write
        self.view = self._state.freeze()

    @property
    def index(self) -> OpenIndex:
        """The base index (a compaction's new one once it is published)."""
        return self._state.index

    @property
    def seq(self) -> int:
        """The sequence number of the last write applied."""
        return self._state.seq

    @property
    def last_position(self) -> int:
        """In a shard: the largest position a written document was given."""
        return self._state.last_position

    @property
    def wal_path(self) -> Path:
        return log_path(self.index.path)

    def apply_logged(self, record: dict) -> str | None:
        """Check a record read from the log as a write is checked, then apply it; why it cannot be applied, or None."""
        return apply_logged(self._state, record)

    # writes

    def upsert(self, documents: list, positions: list[int] | None = None) -> int:
        """Validate every document (SpecError naming `documents[i].field`), embed those that bring no vector, log
        durably, apply; the sequence number. `positions`: in a shard, each document's position in the whole sharded
        index (logged with it)."""
        checked = self._check_batch(documents)  # everything a record holds is checked and converted before it is logged
        if positions is not None:
            checked = [{**doc, "position": int(position)} for doc, position in zip(checked, positions, strict=True)]
        if self.chunker is not None:
            return self._log_and_apply({"op": "upsert", "documents": self._with_passages(checked)})
        assert self.vectors is not None  # set when the index is not chunked
        vectors = np.empty((len(checked), self.vectors.dimension), dtype=np.float32)
        embed = [i for i, doc in enumerate(checked) if "vector" not in doc]
        for i, doc in enumerate(checked):
            if "vector" in doc:
                vectors[i] = doc["vector"]
        if embed:
            vectors[embed] = self._embed([indexed_text(checked[i]["title"], checked[i]["text"]) for i in embed])
        hubness = self._state.hubness  # the banks do not change (a compaction carries them), so this is computed unlocked
        prepared = hubness.prepare([doc["id"] for doc in checked], vectors) if hubness is not None else None
        record_docs = [{**doc, "vector": float32_text(v)} for doc, v in zip(checked, vectors)]
        return self._log_and_apply({"op": "upsert", "documents": record_docs}, prepared)

    def _with_passages(self, checked: list[dict]) -> list[dict]:
        """A chunked index's documents with their passages, embedded: a re-upsert replaces all of a document's passages
        in one record. The document's own vector is its first passage's (what the build keeps)."""
        assert self.chunker is not None
        spans = [self.chunker.spans(doc["text"]) for doc in checked]
        texts = [indexed_text(doc["title"], doc["text"][span.start : span.end]) for doc, mine in zip(checked, spans) for span in mine]
        vectors = self._embed(texts)
        ends = np.cumsum([len(mine) for mine in spans])
        out = []
        for doc, mine, end in zip(checked, spans, ends):
            passages = vectors[end - len(mine) : end]
            out.append({**doc, "vector": float32_text(passages[0]), "passages": encode_passages(mine, passages)})
        return out

    def _embed(self, texts: list[str]) -> np.ndarray:
        if self.write_threads is not None:
            return self._embed_limited(texts, self.write_threads)
        if self.searching is None:
            return self.index.embedder.encode(texts, batch_size=EMBED_BATCH)
        threads = max(1, len(os.sched_getaffinity(0)) // 2)
        return np.concatenate(
            [
                self._embed_limited(chunk, threads) if self.searching() else self.index.embedder.encode(chunk, batch_size=EMBED_BATCH)
                for chunk in (texts[i : i + EMBED_CHUNK] for i in range(0, len(texts), EMBED_CHUNK))
            ]
        )

    def _embed_limited(self, texts: list[str], threads: int) -> np.ndarray:
        """On the collection's own session of `threads` cores, one caller at a time."""
        with self._embed_lock:
            if self._write_embedder is None:
                self._write_embedder = OnnxEmbedder(
                    self.index.path / MODEL_DIR, device="cpu", threads=threads, precision=self.index.manifest.embedder.document_precision
                )
            return self._write_embedder.encode(texts, batch_size=EMBED_BATCH)

    def delete(self, ids: list) -> int:
        return self._log_and_apply({"op": "delete", "ids": check_ids(ids)})

    def _log_and_apply(self, record: dict, prepared: Prepared | None = None) -> int:
        budget.check("embedding the documents")  # past its deadline, a write is dropped before it is logged
        state = self._state
        with self._write_lock:
            if self._closed is not None:
                raise Closed(self._closed)
            try:
                if self._wal is None:
                    self._wal = WriteAheadLog(self.wal_path, lock=True)  # cuts a torn tail; refuses a damaged log
                    self._refuse_if_replaced()  # checked after the open: the log opened is in the folder we loaded
                    replay_records(state, self._wal.take_records())  # records another writer added since we opened
                # the authoritative decision (the early check ran before embedding, unlocked)
                added = decide_types(record["documents"], state.field_types, state.filterable) if record["op"] == "upsert" else {}
                record = {"seq": state.seq + 1, **record}
                self._wal.append(record)  # durable before it is acknowledged; nothing stays of a failed append
            except StorageError as exc:
                self.write_problem = str(exc)
                raise
            self.write_problem = None
            self._refuse_if_replaced()  # logged in the folder that was replaced: gone with it, never acknowledged
            try:
                state.apply(record, prepared, added)
            except Exception as exc:  # logged (a restart applies it) but not here: no write may reuse its number
                self._refuse_writes(f"write {record['seq']} was logged but could not be applied ({exc!r}): reload the collection")
                raise
            return record["seq"]

    def update_manifest(self, change) -> None:
        """Apply `change(manifest)` to the base's manifest on disk and in memory (what changes without a rebuild: the
        API's overrides of the defaults); never while a compaction builds the next base from the current one."""
        with self._compact_lock:
            with self._write_lock:
                self._check_own_folder()  # its manifest would be another folder's
            update_manifest(self.index.path, change)
            change(self.index.manifest)

    def storage_problem(self) -> str | None:
        """Why writes fail now, or None: the last write's failure, or a folder this process cannot write."""
        if self.write_problem is not None:
            return self.write_problem
        return unwritable(self.wal_path, self.index.path)

    def _check_batch(self, documents) -> list[dict]:
        with self._write_lock:
            types = dict(self._state.field_types)
        checked = check_batch(documents, self.max_batch_docs, types, self.vectors)
        decide_types(checked, types, self._state.filterable)  # fail before embedding; decided again when logged
        return checked

    @property
    def filterable(self) -> frozenset[str] | None:
        """The metadata fields a write may make filterable (None: every one): validate.filterable_fields."""
        return self._state.filterable

    def field_types(self) -> dict[str, str | None]:
        """Each metadata field's type in the collection (None: not filterable)."""
        with self._write_lock:
            return dict(self._state.field_types)

    # reads

    def get(self, doc_id: str) -> dict | None:
        """The latest acknowledged version of a document (read-your-writes, before any refresh)."""
        with self._write_lock:
            return self._state.get(doc_id)

    def follow(self, up_to: int | None = None) -> ReadView:
        """Apply and publish what another process logged since, up to sequence number `up_to` (None: all of it): a
        replica serving a shard that a writer elsewhere takes writes for. When that writer compacted (the manifest on
        disk names another base, or the log skips a sequence number: it was cut), the index is opened again first."""
        with self._write_lock:
            for _ in range(3):  # a compaction may swap the folder between the reads: look again
                on_disk = read_manifest(self.index.path)
                if (on_disk.created_at, on_disk.applied_sequence) != (self.index.manifest.created_at, self.index.manifest.applied_sequence):
                    self._follow_new_base()
                records = [
                    r
                    for r in WriteAheadLog.replay(self.wal_path)  # a torn tail: in progress
                    if r["seq"] > self.seq and (up_to is None or r["seq"] <= up_to)
                ]
                if not records or records[0]["seq"] == self.seq + 1:
                    replay_records(self._state, records)
                    break
        return self.refresh()

    def _follow_new_base(self) -> None:
        """(write lock held) Start over on the base the writer published; its log is applied next."""
        fresh = reopen(self.index)
        self._state.start(fresh, fresh.manifest.applied_sequence)
        self._state.dirty = True

    # visibility

    def refresh(self) -> ReadView:
        """Publish the writes applied so far to searches (a no-op when nothing changed). One refresh at a time (the
        refresher, `?wait=true` writes, compaction): an older view is never published over a newer one."""
        with self._refresh_lock:
            with self._write_lock:
                if not self._state.dirty:
                    return self.view
                self._state.dirty = False
                view = self._state.freeze()
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

    # compaction

    def compact(self) -> ReadView:
        """Merge the live segment and the deletions into a new base segment, published atomically in place of the
        index folder; writes continue while it builds. Rankings do not change (the same documents, the same
        statistics). The log moves into the new folder (hard link) before the swap, and the new manifest records
        the last sequence it holds, so a crash at any point leaves the old or the new base with every write. A
        collection closed before the swap (dropped, restored over) publishes nothing: Closed, with the reason."""
        with self._compact_lock:
            with self._write_lock:
                if self._closed is not None:  # its folder may be another collection's by now (a restore over it)
                    raise Closed(self._closed)
                self._refuse_if_replaced()
                state = self._state.freeze()
            if not state.live.docs and state.base_alive.all():
                return self.refresh()  # nothing to merge
            path = state.index.path
            with scratch_dir(path) as work:
                corpus, vectors = current_corpus(state.index, state.base_alive, state.live.docs, work)
                held = False
                try:
                    with publish_dir(path) as tmp:
                        build_compacted(state, corpus, vectors, tmp, self.on_compact, checkpoint=self._stop_if_closed)
                        self._write_lock.acquire()  # held across the swap: no write may fall between the two folders
                        held = True
                        if self._closed is not None:  # dropped or restored over while it built: the folder is not ours
                            raise Closed(self._closed)
                        self._refuse_if_replaced()  # another process published its folder there meanwhile
                        link_log(path, tmp)
                    try:
                        fresh = reopen(state.index)
                    except BaseException:  # the folder is this collection's own new base, whose log is the one it holds
                        state.index.folder_id = folder_identity(path)
                        raise
                    self._reopen(fresh, state.seq)
                finally:
                    if held:
                        self._write_lock.release()
        logger.info("compacted %s: %d documents up to sequence %d", path, self.view.documents, state.seq)
        remove_leftovers(path)
        return self.refresh()

    def _stop_if_closed(self) -> None:
        """Between a compaction's stages: a collection closed meanwhile (dropped, restored over, reloaded) takes no
        new base, so the build stops here instead of finishing first (close() waits for it). Read without the lock:
        the swap checks again under it."""
        if self._closed is not None:
            raise Closed(self._closed)

    def needs_compaction(self, fraction: float, min_docs: int) -> bool:
        """Whether the live segment and the deletions have grown past `fraction` of the base (and `min_docs`)."""
        changed = len(self._state.live) + int((~self._state.base_alive).sum())
        return changed >= max(min_docs, fraction * len(self._state.base_alive))

    @property
    def compacting(self) -> bool:
        return self._compact_lock.locked()

    def _reopen(self, index: OpenIndex, applied: int) -> None:
        """Continue on the compacted base: writes logged after `applied` are applied on top of it (lock held)."""
        try:
            self._state.start(index, applied)
            newer = [r for r in WriteAheadLog.replay(log_path(index.path)) if r["seq"] > applied]
            replay_records(self._state, newer)
        except Exception as exc:  # the state is half rebuilt: no write may be numbered on top of it
            self._refuse_writes(f"the compacted base could not take the writes logged meanwhile ({exc}): reload the collection")
            raise
        if self._wal is not None:  # keep only what the base does not hold yet
            self._wal.close()
            self._wal = None  # the new base is in service even if the log cannot be shortened now
            try:
                self._wal = WriteAheadLog.rewrite(log_path(index.path), newer)
            except (OSError, StorageError) as exc:  # the next write opens the log as it is (the base's records skipped)
                self.write_problem = f"{log_path(index.path)} could not be shortened after a compaction: {exc}"
                logger.warning("%s", self.write_problem)
        self._state.dirty = True

    def stats(self) -> dict:
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
        with self._compact_lock:
            with self._write_lock:
                self._check_own_folder()  # its files would not be those of the writes it holds
                state = self._state
                log = self.wal_path
                point = Point(state.seq, log.stat().st_size if log.exists() else 0, int(state.base_alive.sum()) + len(state.live))
            yield point

    def _replaced(self) -> str | None:
        """Why the folder at the index's path is not the one this collection loaded (another process published a
        folder there: a snapshot restore, a reembed, a rebuild in place), or None."""
        index = self.index
        if index.folder_id is None or folder_identity(index.path) == index.folder_id:
            return None
        return f"{index.path} was replaced by another process (a snapshot restore, a reembed or a rebuild in place)"

    def _check_own_folder(self) -> None:
        """(write lock held) Refuse to read or change the folder on disk as this collection's when it was replaced."""
        if (replaced := self._replaced()) is not None:
            raise HybridError(f"{replaced} since this collection opened it: reload the collection first")

    def _refuse_if_replaced(self) -> None:
        """(write lock held) Writes must go into the log of the folder whose documents this collection holds: one
        written into a folder published in its place would be numbered and applied against other documents."""
        if (replaced := self._replaced()) is not None:
            self._refuse_writes(f"{replaced} since this collection opened it: reload the collection to serve the new folder")
            raise Closed(self._closed)

    def _refuse_writes(self, reason: str) -> None:
        """Close the log for good after the state and the log parted (write lock held): `reason` answers every write."""
        self._closed = reason
        if self._wal is not None:
            self._wal.close()
            self._wal = None

    def close(self, reason: str = "this collection is closed") -> None:
        """Close the log; later writes are refused with `reason` (a drop, a restore over it, shutdown). Returns once
        a compaction in progress has stopped, at the end of its current stage: it publishes nothing after this (its
        folder may be dropped or replaced)."""
        with self._write_lock:
            self._refuse_writes(reason)
        with self._compact_lock:
            pass
