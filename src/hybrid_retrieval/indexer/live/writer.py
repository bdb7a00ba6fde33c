"""The writer of a live collection: each batch checked whole, embedded where no vector came with it, appended to the
write-ahead log and fsync'ed, then applied to the in-memory state. Its lock (the write lock) guards the state and the
log; the reader and the compactor take it to read the state, and the compactor holds it across a swap.
"""

from __future__ import annotations

import logging
import threading

from hybrid_retrieval.common.errors import HybridError, StorageError
from hybrid_retrieval.indexer.live.apply import LiveState
from hybrid_retrieval.indexer.live.embedding import WriteEmbedding
from hybrid_retrieval.indexer.live.fence import Closed, replaced
from hybrid_retrieval.indexer.live.log import log_path, unwritable
from hybrid_retrieval.indexer.live.replay import replay_records
from hybrid_retrieval.indexer.live.validate import VectorRule, check_batch, check_ids, decide_types
from hybrid_retrieval.indexer.store import OpenIndex
from hybrid_retrieval.indexer.wal import WriteAheadLog
from hybrid_retrieval.models.embedder import NO_MODEL
from hybrid_retrieval.search import budget
from hybrid_retrieval.search.live_hubness import Prepared

logger = logging.getLogger(__name__)


class Writer:
    """Takes the writes of the collection over `index`; nothing is written until the first write."""

    def __init__(self, index: OpenIndex, max_batch_docs: int, embed: WriteEmbedding):
        self.max_batch_docs, self.embed = max_batch_docs, embed
        # documents may bring their own vectors of the index's dimension; without a model, they must. A chunked index
        # embeds its documents' passages itself (indexer.representation): its documents bring none.
        no_model = index.manifest.embedder.document_backend == NO_MODEL
        chunked = index.representation.chunked
        self.vectors = None if chunked else VectorRule(index.dense.dimension, required=no_model)
        self.state = LiveState(index, index.manifest.applied_sequence)
        self.lock = threading.Lock()
        self.problem: str | None = None  # why the last write could not be logged (cleared by the next that is)
        self.closed: str | None = None  # why writes are refused for good (close)
        self.wal: WriteAheadLog | None = None  # opened (and the index locked for writing) by the first write
        # the records applied since a compaction froze the state, which continue_on applies on the new base (reading
        # them back from the log decoded every record again, all under the interpreter lock); None: no compaction
        self.logged_since: list[dict] | None = None

    def upsert(self, documents: list, positions: list[int] | None = None) -> int:
        """Validate every document (SpecError naming `documents[i].field`), embed those that bring no vector, log
        durably, apply; the sequence number. `positions`: in a shard, each document's position in the whole sharded
        index (logged with it)."""
        checked = self.check_batch(documents)  # everything a record holds is checked and converted before it is logged
        if positions is not None:
            checked = [{**doc, "position": int(position)} for doc, position in zip(checked, positions, strict=True)]
        record_docs, vectors = self.state.index.representation.embed_writes(checked, self.embed)
        hubness = self.state.hubness  # the banks do not change (a compaction carries them), so this is computed unlocked
        prepared = hubness.prepare([doc["id"] for doc in checked], vectors) if hubness is not None and vectors is not None else None
        return self._log_and_apply({"op": "upsert", "documents": record_docs}, prepared)

    def delete(self, ids: list) -> int:
        return self._log_and_apply({"op": "delete", "ids": check_ids(ids)})

    def _log_and_apply(self, record: dict, prepared: Prepared | None = None) -> int:
        budget.check("embedding the documents")  # past its deadline, a write is dropped before it is logged
        state = self.state
        with self.lock:
            if self.closed is not None:
                raise Closed(self.closed)
            try:
                if self.wal is None:
                    self.wal = WriteAheadLog(log_path(state.index.path), lock=True)  # cuts a torn tail; refuses a damaged log
                    self.refuse_if_replaced()  # checked after the open: the log opened is in the folder we loaded
                    replay_records(state, self.wal.take_records())  # records another writer added since we opened
                # the authoritative decision (the early check ran before embedding, unlocked)
                added = decide_types(record["documents"], state.field_types, state.filterable) if record["op"] == "upsert" else {}
                record = {"seq": state.seq + 1, **record}
                self.wal.append(record)  # durable before it is acknowledged; nothing stays of a failed append
            except StorageError as exc:
                self.problem = str(exc)
                raise
            self.problem = None
            self.refuse_if_replaced()  # logged in the folder that was replaced: gone with it, never acknowledged
            try:
                state.apply(record, prepared, added)
            except Exception as exc:  # logged (a restart applies it) but not here: no write may reuse its number
                self.refuse(f"write {record['seq']} was logged but could not be applied ({exc!r}): reload the collection")
                raise
            if self.logged_since is not None:
                self.logged_since.append(record)
            return int(record["seq"])

    def check_batch(self, documents: list) -> list[dict]:
        """The batch checked and converted, its metadata types decided (again when it is logged): fails before embedding."""
        with self.lock:
            types = dict(self.state.field_types)
        checked = check_batch(documents, self.max_batch_docs, types, self.vectors)
        decide_types(checked, types, self.state.filterable)
        return checked

    def field_types(self) -> dict[str, str | None]:
        with self.lock:
            return dict(self.state.field_types)

    def get(self, doc_id: str) -> dict | None:
        with self.lock:
            return self.state.get(doc_id)

    def storage_problem(self) -> str | None:
        """Why writes fail now, or None: the last write's failure, or a folder this process cannot write."""
        if self.problem is not None:
            return self.problem
        return unwritable(log_path(self.state.index.path), self.state.index.path)

    def continue_on(self, index: OpenIndex, applied: int) -> None:
        """(lock held) Continue on a compacted base that holds the writes up to `applied`: those logged after it are
        applied on top, and the log is cut to them."""
        try:
            newer = self._logged_after(applied)
            self.state.start(index, applied)
            replay_records(self.state, newer)  # the documents analysed on the old base are not analysed again
            self.state.forget_previous()
        except Exception as exc:  # the state is half rebuilt: no write may be numbered on top of it
            self.refuse(f"the compacted base could not take the writes logged meanwhile ({exc}): reload the collection")
            raise
        if self.wal is not None:  # keep only what the base does not hold yet
            self.wal.close()
            self.wal = None  # the new base is in service even if the log cannot be shortened now
            try:
                self.wal = WriteAheadLog.rewrite(log_path(index.path), newer)
            except (OSError, StorageError) as exc:  # the next write opens the log as it is (the base's records skipped)
                self.problem = f"{log_path(index.path)} could not be shortened after a compaction: {exc}"
                logger.warning("%s", self.problem)
        self.state.dirty = True

    def _logged_after(self, applied: int) -> list[dict]:
        """(lock held) The records after sequence `applied`, as applied: those kept since the compaction froze the
        state when they are all there (another writer's records replayed meanwhile are not), else read from the log."""
        kept = self.logged_since
        if kept is not None and [r["seq"] for r in kept] == list(range(applied + 1, self.state.seq + 1)):
            return kept
        return [r for r in WriteAheadLog.replay(log_path(self.state.index.path)) if r["seq"] > applied]

    def check_own_folder(self) -> None:
        """(lock held) Refuse to read or change the folder on disk as this collection's when it was replaced."""
        if (reason := replaced(self.state.index)) is not None:
            raise HybridError(f"{reason} since this collection opened it: reload the collection first")

    def refuse_if_replaced(self) -> None:
        """(lock held) Close for good when another process published a folder in place of the one loaded."""
        if (reason := replaced(self.state.index)) is not None:
            self.refuse(f"{reason} since this collection opened it: reload the collection to serve the new folder")
            raise Closed(self.closed)

    def refuse(self, reason: str) -> None:
        """(lock held) Close the log for good (the state and the log parted, or the collection closed): `reason`
        answers every later write."""
        self.closed = reason
        if self.wal is not None:
            self.wal.close()
            self.wal = None
