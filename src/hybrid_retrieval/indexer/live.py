"""A live collection: the built index (the base segment) plus documents written since, durable and searchable.

Writes (upserts by id, deletes) are validated whole, embedded with the index's own ONNX model, appended to the
write-ahead log (indexer.wal) and fsync'ed before they are acknowledged with a sequence number; then they are
applied to the in-memory state. Searches read an immutable `Snapshot` (base + live segment + deletions) that a
refresh builds from that state and swaps in with one reference assignment, so a search never waits for a
write and never sees half of one. On open, the log is replayed: nothing acknowledged is lost.

The log lives in `live/` inside the index folder. BM25 uses the statistics of the documents that exist at the
snapshot (search.segments.LiveBM25), so rankings equal a fresh build's of the same documents.
"""

from __future__ import annotations

import base64
import functools
import json
import logging
import os
import re
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from hybrid_retrieval.common.publish import publish_dir, scratch_dir
from hybrid_retrieval.indexer.build import EMBED_BATCH, BuildOptions, build_into
from hybrid_retrieval.indexer.leftovers import remove_leftovers
from hybrid_retrieval.indexer.hubness import correction_folder_name, write_correction
from hybrid_retrieval.indexer.corpus import indexed_text
from hybrid_retrieval.indexer.manifest import Manifest, read_manifest, write_manifest
from hybrid_retrieval.indexer.store import MODEL_DIR, OpenIndex, file_inventory, open_index
from hybrid_retrieval.indexer.wal import Salvage, WriteAheadLog, salvage
from hybrid_retrieval.models.embedder import OnnxEmbedder
from hybrid_retrieval.search import budget
from hybrid_retrieval.search.errors import HybridError, SpecError, StorageError
from hybrid_retrieval.search.filters.columns import MetadataCollector, MetadataColumns
from hybrid_retrieval.search.filters.types import FieldInfo, encodable, type_of_kind, written_value
from hybrid_retrieval.search.hits import Presenter
from hybrid_retrieval.search.pipeline import SearchPipeline
from hybrid_retrieval.search.rerank import Reranker
from hybrid_retrieval.search.live_hubness import LiveHubness, LiveHubnessView, Prepared
from hybrid_retrieval.search.segments import LiveBM25, LiveDense, LiveDocument, LiveSegment, LiveVectors, check_live_method, concat_columns

logger = logging.getLogger(__name__)

LIVE_DIR = "live"
WAL_FILE = "wal.log"
MAX_ID_BYTES = 512
DEFAULT_MAX_BATCH_DOCS = 1000
EMBED_CHUNK = 32  # documents embedded per decision of where (all cores, or half while searches run)


@dataclass(frozen=True)
class Snapshot:
    """What searches read: the base index, the live documents, which base documents are deleted, as of `seq`."""

    index: OpenIndex
    live: LiveSegment
    base_alive: np.ndarray  # bool (n,)
    seq: int
    field_types: dict  # each metadata field's type in the collection (None: not filterable)
    hubness: LiveHubnessView | None = None  # the fitted correction extended to the writes (None: no fit, or no banks)

    @property
    def changed(self) -> bool:
        """Whether writes changed anything searches see: documents, deletions, or a filterable field added."""
        added = any(kind and name not in self.index.manifest.metadata for name, kind in self.field_types.items())
        return len(self.live) > 0 or not bool(self.base_alive.all()) or added

    @property
    def num_docs(self) -> int:
        """Documents in the numbering (base then live), deleted base documents included."""
        return len(self.base_alive) + len(self.live)

    @property
    def documents(self) -> int:
        """Documents that exist."""
        return int(self.base_alive.sum()) + len(self.live)

    def document(self, doc_idx: int) -> dict:
        if doc_idx < len(self.base_alive):
            return self.index.docs.get(doc_idx)
        doc = self.live.docs[doc_idx - len(self.base_alive)]
        return {"id": doc.doc_id, "title": doc.title, "text": doc.text, "metadata": doc.metadata}

    def doc_text(self, doc_idx: int) -> str:
        doc = self.document(doc_idx)
        return indexed_text(doc["title"], doc["text"])

    @functools.cached_property
    def metadata(self) -> MetadataColumns | None:
        """The filterable columns over both segments, built once per snapshot (its pipeline and presenter share them)."""
        if not self.changed:
            return self.index.metadata
        live = _live_columns(self.field_types, self.live, self.index.manifest.metadata)
        return concat_columns(self.index.metadata, live, len(self.base_alive), len(self.live))

    def pipeline(self, overrides: dict | None = None, executor=None, cross_encoder=None, cross_encoder_name: str = "",
                 embedder=None) -> SearchPipeline:
        """As OpenIndex.pipeline, over the snapshot. An unchanged snapshot is served by the base index as built."""
        if not self.changed:
            return self.index.pipeline(overrides, executor, cross_encoder, cross_encoder_name, embedder)
        index = self.index
        defaults = index.manifest.defaults.merge(overrides)
        alive = None if self.base_alive.all() else np.concatenate([self.base_alive, np.ones(len(self.live), bool)])
        hubness, unfitted = None, {}
        if self.hubness is not None:
            hubness = self.hubness.searcher(index.hubness, self.live.vectors, alive)
        elif index.hubness is not None:
            if defaults.hubness.method != "none":
                logger.warning("hubness correction is not applied to the written documents: the fit has no banks")
                defaults = defaults.merge({"hubness": {"method": "none"}})
            unfitted = {"no_hubness_reason": (
                "this index's hubness correction was fitted before fits kept their banks, so it cannot be extended to "
                "written documents: refit it with `hybrid hubness fit`")}
        reranker = Reranker(cross_encoder, self.doc_text, cross_encoder_name) if cross_encoder is not None else None
        return SearchPipeline(
            LiveBM25(index.bm25, index.postings, index.manifest.bm25, self.base_alive, self.live),
            LiveDense(index.dense, self.live.vectors), embedder or index.query_embedder,
            LiveVectors(index.embeddings, self.live.vectors), defaults=defaults, executor=executor, hubness=hubness,
            reranker=reranker, metadata=self.metadata, alive=alive, **unfitted)

    def presenter(self, embedder=None) -> Presenter:
        fields = set(self.index.manifest.metadata) | {name for doc in self.live.docs for name in doc.metadata}
        return Presenter(self.document, self.index.analyzer, embedder or self.index.embedder, sorted(fields), self.metadata)


def current_view(index: OpenIndex) -> OpenIndex | Snapshot:
    """What a search of `index` should read: the built index with the writes its log holds (read-only: nothing is
    locked or written), or the index itself when it has no log."""
    if not (index.path / LIVE_DIR / WAL_FILE).exists():
        return index
    return Collection(index).snapshot


def _live_columns(types: dict[str, str | None], live: LiveSegment, base_fields: dict):
    """The filterable columns of the written documents, each field of the type the collection decided for it: a field
    that is not filterable in the collection (None) never gets a column from writes, so a filter is exact or refused.
    A field a write added keeps its column when no document holds it any more (its type stays decided)."""
    filterable = {name: kind for name, kind in types.items() if kind is not None}
    added = [name for name in filterable if name not in base_fields]
    if not live.docs and not added:
        return None
    collector = MetadataCollector(types=filterable)
    for doc in live.docs:
        collector.add({name: value for name, value in doc.metadata.items() if name in filterable})
    columns = collector.finish()
    for name in added:
        if name not in columns.columns:
            columns.columns[name] = collector.empty_column(filterable[name])
            columns.fields[name] = FieldInfo(filterable[name], 0, 0 if filterable[name] == "keyword" else None)
    return columns if columns.columns else None


def field_types_of(fields: dict) -> dict[str, str | None]:
    """Each metadata field's type as an index's manifest decided it (None: not filterable)."""
    return {name: info.type for name, info in fields.items()}


def restricted_fields(fields: dict) -> bool:
    """Whether the index was built with `--filterable` naming its filterable fields (then written fields are not)."""
    return any(info.reason == "not listed in --filterable" for info in fields.values())


class ReplayError(HybridError):
    """A logged record that cannot be applied: the collection is not opened (`hybrid repair` drops such records)."""


class Collection:
    """The writable collection over an opened index: writes are logged, applied, and published by `refresh`."""

    def __init__(self, index: OpenIndex, max_batch_docs: int = DEFAULT_MAX_BATCH_DOCS, on_refresh=None,
                 write_threads: int | None = None, searching=None, replay: bool = True):
        """Replay the index's log (if any); nothing is written until the first write. `on_refresh(snapshot)` is
        called before a new snapshot counts as visible (the service swaps its searches to it there).

        Where written documents are embedded: with `write_threads`, always on a session of that many cores, one batch
        at a time. Otherwise on all cores (the index's own session, the fastest ingest), except while `searching()`
        says searches are running: then each chunk of a batch goes to a session on half the cores, so writes cannot
        take every core from searches (docs/BENCHMARKS.md, "Live writes", measures both)."""
        self.index, self.max_batch_docs, self.on_refresh = index, max_batch_docs, on_refresh
        # what else a compaction writes into the new base folder before its manifest: on_compact(state, manifest, folder)
        self.on_compact = None
        self.write_threads, self.searching = write_threads, searching
        self._write_embedder = None
        self._embed_lock = threading.Lock()
        index.postings  # noqa: B018  (refuse early an index that cannot take writes)
        self.last_position = -1  # in a shard: the largest position a written document was given
        check_live_method(index.manifest.bm25)
        self._start(index)
        self._write_lock = threading.Lock()
        self._compact_lock = threading.Lock()
        self._refresh_lock = threading.Lock()
        self._visible = threading.Condition()
        self._dirty = False
        self.seq = index.manifest.applied_sequence
        self.write_problem: str | None = None  # why the last write could not be logged (cleared by the next that is)
        if replay:
            self._replay(WriteAheadLog.replay(self.wal_path))
        self._wal: WriteAheadLog | None = None  # opened (and the index locked for writing) by the first write
        self.snapshot = self._build_snapshot()

    @property
    def wal_path(self) -> Path:
        return self.index.path / LIVE_DIR / WAL_FILE

    def _replay(self, records) -> None:
        """Apply logged records newer than what the base holds (older ones are in it already: a compaction). A record
        that cannot be applied stops the replay with its sequence number (ReplayError), and nothing is served."""
        try:
            for record in records:
                if record["seq"] > self.seq:
                    why = self.apply_logged(record)
                    if why is not None:
                        raise ReplayError(f"{self.wal_path}: the record with sequence number {record['seq']} cannot be "
                                          f"applied ({why}). Run `hybrid repair {self.index.path}` to drop it (it reports "
                                          "what it drops)")
        except (KeyError, TypeError) as exc:  # a record without a sequence number
            raise ReplayError(f"{self.wal_path}: a record is not a write ({exc!r}); run `hybrid repair {self.index.path}`") from None

    def apply_logged(self, record: dict) -> str | None:
        """Check a record read from the log as a write is checked, then apply it; why it cannot be applied, or None."""
        try:
            if record.get("op") == "upsert":
                docs = record["documents"]
                checked = check_batch([{k: d[k] for k in ("id", "title", "text", "metadata") if k in d} for d in docs],
                                      2**31, self._field_types)
                added = decide_types(checked, self._field_types, self._restricted)
                for doc in docs:
                    if len(base64.b64decode(doc["vector"], validate=True)) != 4 * self.index.dense.dimension:
                        raise SpecError(("documents", doc["id"], "vector"), f"not {self.index.dense.dimension} float32 values")
                record = {**record, "documents": [{**c, "vector": d["vector"], **({"position": int(d["position"])}
                                                   if "position" in d else {})} for c, d in zip(checked, docs)]}
            elif record.get("op") == "delete":
                record, added = {**record, "ids": check_ids(record["ids"])}, {}
            else:
                return f"unknown operation {record.get('op')!r}"
        except (SpecError, KeyError, TypeError, ValueError) as exc:
            return str(exc) or repr(exc)
        self._apply(record, added=added)
        return None

    # writes

    def upsert(self, documents: list, positions: list[int] | None = None) -> int:
        """Validate every document (SpecError naming `documents[i].field`), embed, log durably, apply; the sequence
        number. `positions`: in a shard, each document's position in the whole sharded index (logged with it)."""
        checked = self._check_batch(documents)  # everything a record holds is checked and converted before it is logged
        if positions is not None:
            checked = [{**doc, "position": int(position)} for doc, position in zip(checked, positions, strict=True)]
        texts = [indexed_text(doc["title"], doc["text"]) for doc in checked]
        vectors = self._embed(texts)
        hubness = self._hubness  # the banks do not change (a compaction carries them), so this is computed unlocked
        prepared = hubness.prepare([doc["id"] for doc in checked], vectors) if hubness is not None else None
        record_docs = [{**doc, "vector": base64.b64encode(np.asarray(v, dtype="<f4").tobytes()).decode()}
                       for doc, v in zip(checked, vectors)]
        return self._log_and_apply({"op": "upsert", "documents": record_docs}, prepared)

    def _embed(self, texts: list[str]) -> np.ndarray:
        if self.write_threads is not None:
            return self._embed_limited(texts, self.write_threads)
        if self.searching is None:
            return self.index.embedder.encode(texts, batch_size=EMBED_BATCH)
        threads = max(1, len(os.sched_getaffinity(0)) // 2)
        return np.concatenate([self._embed_limited(chunk, threads) if self.searching()
                               else self.index.embedder.encode(chunk, batch_size=EMBED_BATCH)
                               for chunk in (texts[i : i + EMBED_CHUNK] for i in range(0, len(texts), EMBED_CHUNK))])

    def _embed_limited(self, texts: list[str], threads: int) -> np.ndarray:
        """On the collection's own session of `threads` cores, one caller at a time."""
        with self._embed_lock:
            if self._write_embedder is None:
                self._write_embedder = OnnxEmbedder(self.index.path / MODEL_DIR, device="cpu", threads=threads,
                                                    precision=self.index.manifest.embedder.document_precision)
            return self._write_embedder.encode(texts, batch_size=EMBED_BATCH)

    def delete(self, ids: list) -> int:
        return self._log_and_apply({"op": "delete", "ids": check_ids(ids)})

    def _log_and_apply(self, record: dict, prepared: Prepared | None = None) -> int:
        budget.check("embedding the documents")  # past its deadline, a write is dropped before it is logged
        with self._write_lock:
            try:
                if self._wal is None:
                    self._wal = WriteAheadLog(self.wal_path, lock=True)  # cuts a torn tail; refuses a damaged log
                    self._replay(self._wal.take_records())  # records another writer added since we opened
                # the authoritative decision (the early check ran before embedding, unlocked)
                added = decide_types(record["documents"], self._field_types, self._restricted) if record["op"] == "upsert" else {}
                record = {"seq": self.seq + 1, **record}
                self._wal.append(record)  # durable before it is acknowledged; nothing stays of a failed append
            except StorageError as exc:
                self.write_problem = str(exc)
                raise
            self.write_problem = None
            self._apply(record, prepared, added)
            return record["seq"]

    def storage_problem(self) -> str | None:
        """Why writes fail now, or None: the last write's failure, or a folder this process cannot write."""
        if self.write_problem is not None:
            return self.write_problem
        folder = self.wal_path.parent if self.wal_path.parent.exists() else self.index.path
        if os.statvfs(folder).f_flag & os.ST_RDONLY:
            return f"{folder} is on a read-only filesystem"
        if not os.access(folder, os.W_OK) or (self.wal_path.exists() and not os.access(self.wal_path, os.W_OK)):
            return f"{folder} is not writable by this process"
        return None

    def _start(self, index: OpenIndex) -> None:
        """Begin on `index` as base, with nothing written on top of it yet."""
        self.index = index
        self._base_idx = index.doc_positions
        self._base_alive = np.ones(index.num_docs, dtype=bool)
        self._live: dict[str, LiveDocument] = {}
        self._vocabulary: dict[str, int] = {}  # terms of the live documents (search.segments.LiveSegment)
        # keys of documents for the hubness state: base index, or num_docs + a serial for written ones (search.live_hubness)
        self._keys: dict[str, int] = {}
        self._next_key = index.num_docs
        has_banks = index.hubness is not None and index.hubness.banks is not None
        self._hubness = LiveHubness(index.hubness, index.num_docs) if has_banks else None
        # each metadata field's type, decided once: the index's, or the first write's for a field it lacks
        self._field_types = field_types_of(index.manifest.metadata)
        self._restricted = restricted_fields(index.manifest.metadata)

    def _apply(self, record: dict, prepared: Prepared | None = None, added: dict | None = None) -> None:
        """Apply a checked record; `added`: the types of the metadata fields it adds (decide_types)."""
        ids = [doc["id"] for doc in record["documents"]] if record["op"] == "upsert" else record["ids"]
        removed = [key for key in map(self._remove, ids) if key is not None]
        if self._hubness is not None and removed:
            self._hubness.remove(removed)
        if record["op"] == "upsert":
            self._field_types.update(added or {})
            vectors = []
            for doc in record["documents"]:
                vectors.append(np.frombuffer(base64.b64decode(doc["vector"]), dtype="<f4"))
                tokens = self.index.analyzer.analyze(indexed_text(doc["title"], doc["text"]))
                self._live[doc["id"]] = LiveDocument.analysed(doc["id"], doc["title"], doc["text"], doc["metadata"], tokens,
                                                              vectors[-1], self._vocabulary, doc.get("position", -1))
                self.last_position = max(self.last_position, doc.get("position", -1))
                self._keys[doc["id"]], self._next_key = self._next_key, self._next_key + 1
            if self._hubness is not None:
                prepared = prepared or self._hubness.prepare(ids, np.stack(vectors))
                self._hubness.add(np.array([self._keys[i] for i in ids], dtype=np.int64), prepared)
        self.seq = record["seq"]
        self._dirty = True

    def _remove(self, doc_id: str) -> int | None:
        """Forget the document's current version; its key (None: it did not exist)."""
        if self._live.pop(doc_id, None) is not None:
            return self._keys.pop(doc_id)
        idx = self._base_idx.get(doc_id)
        if idx is None or not self._base_alive[idx]:
            return None
        self._base_alive[idx] = False
        return idx

    def _key_of(self, doc_id: str) -> int:
        if doc_id in self._keys:
            return self._keys[doc_id]
        idx = self._base_idx.get(doc_id)
        return idx if idx is not None and self._base_alive[idx] else -1

    def _check_batch(self, documents) -> list[dict]:
        with self._write_lock:
            types = dict(self._field_types)
        checked = check_batch(documents, self.max_batch_docs, types)
        decide_types(checked, types, self._restricted)  # fail before embedding; decided again when logged
        return checked

    def field_types(self) -> dict[str, str | None]:
        """Each metadata field's type in the collection (None: not filterable)."""
        with self._write_lock:
            return dict(self._field_types)

    # reads

    def get(self, doc_id: str) -> dict | None:
        """The latest acknowledged version of a document (read-your-writes, before any refresh)."""
        with self._write_lock:
            live = self._live.get(doc_id)
            if live is not None:
                return {"id": live.doc_id, "title": live.title, "text": live.text, "metadata": live.metadata}
            idx = self._base_idx.get(doc_id)
            return self.index.docs.get(idx) if idx is not None and self._base_alive[idx] else None

    def follow(self, up_to: int | None = None) -> Snapshot:
        """Apply and publish what another process logged since, up to sequence number `up_to` (None: all of it): a
        replica serving a shard that a writer elsewhere takes writes for. When that writer compacted (the manifest on
        disk names another base, or the log skips a sequence number: it was cut), the index is opened again first."""
        with self._write_lock:
            for _ in range(3):  # a compaction may swap the folder between the reads: look again
                on_disk = read_manifest(self.index.path)
                if (on_disk.created_at, on_disk.applied_sequence) != (self.index.manifest.created_at,
                                                                      self.index.manifest.applied_sequence):
                    self._follow_new_base()
                records = [r for r in WriteAheadLog.replay(self.wal_path)  # a torn tail: in progress
                           if r["seq"] > self.seq and (up_to is None or r["seq"] <= up_to)]
                if not records or records[0]["seq"] == self.seq + 1:
                    self._replay(records)
                    break
        return self.refresh()

    def _follow_new_base(self) -> None:
        """(write lock held) Start over on the base the writer published; its log is applied next."""
        index = self.index
        fresh = open_index(index.path, verify="size", device="gpu" if index.dense.on_gpu else "cpu",
                           embedder=index.embedder, query_precision=index.query_precision)
        self._start(fresh)
        self.seq, self._dirty = fresh.manifest.applied_sequence, True

    # visibility

    def refresh(self) -> Snapshot:
        """Publish the writes applied so far to searches (a no-op when nothing changed). One refresh at a time (the
        refresher, `?wait=true` writes, compaction): an older snapshot is never published over a newer one."""
        with self._refresh_lock:
            with self._write_lock:
                if not self._dirty:
                    return self.snapshot
                self._dirty = False
                snapshot = self._build_snapshot()
            if self.on_refresh is not None:
                self.on_refresh(snapshot)
            with self._visible:
                self.snapshot = snapshot  # one reference assignment: searches see the old or the new snapshot
                self._visible.notify_all()
            return snapshot

    def _build_snapshot(self) -> Snapshot:
        """The current state, frozen (write lock held)."""
        live = LiveSegment(list(self._live.values()), self.index.dense.dimension, self._vocabulary)
        hubness = None
        if self._hubness is not None:
            hubness = self._hubness.view(self.index.embeddings, self._base_alive, np.array(list(self._keys.values()), dtype=np.int64),
                                         live.vectors, self._key_of)
        return Snapshot(self.index, live, self._base_alive.copy(), self.seq, dict(self._field_types), hubness)

    def wait_visible(self, seq: int, timeout: float) -> bool:
        """Block until a snapshot at `seq` or later is searchable (True), or `timeout` seconds pass (False)."""
        deadline = time.monotonic() + timeout
        with self._visible:
            while self.snapshot.seq < seq:
                left = deadline - time.monotonic()
                if left <= 0 or not self._visible.wait(left):
                    return self.snapshot.seq >= seq
        return True

    # compaction

    def compact(self) -> Snapshot:
        """Merge the live segment and the deletions into a new base segment, published atomically in place of the
        index folder; writes continue while it builds. Rankings do not change (the same documents, the same
        statistics). The log moves into the new folder (hard link) before the swap, and the new manifest records
        the last sequence it holds, so a crash at any point leaves the old or the new base with every write."""
        with self._compact_lock:
            with self._write_lock:
                state = self._build_snapshot()
            seq, base_alive, live = state.seq, state.base_alive, state.live.docs
            if not live and base_alive.all():
                return self.refresh()  # nothing to merge
            index = self.index
            path = index.path
            with scratch_dir(path) as work:
                corpus, vectors = current_corpus(index, base_alive, live, work)
                held = False
                try:
                    with publish_dir(path) as tmp:
                        options = replace(build_options_of(index), field_types={
                            name: kind for name, kind in state.field_types.items() if kind is not None})
                        manifest = build_into(tmp, corpus, options, index.path / MODEL_DIR,
                                              json.loads((index.path / MODEL_DIR / "embedder.json").read_text()), vectors=vectors)
                        _carry_over(state, manifest, tmp, vectors)
                        if self.on_compact is not None:
                            self.on_compact(state, manifest, tmp)
                        write_manifest(tmp, manifest)
                        self._write_lock.acquire()  # held across the swap: no write may fall between the two folders
                        held = True
                        (tmp / LIVE_DIR).mkdir()
                        wal = path / LIVE_DIR / WAL_FILE
                        if wal.exists():
                            os.link(wal, tmp / LIVE_DIR / WAL_FILE)
                    self._reopen(open_index(path, verify="size", device="gpu" if index.dense.on_gpu else "cpu",
                                            embedder=index.embedder, query_precision=index.query_precision), seq)
                finally:
                    if held:
                        self._write_lock.release()
        logger.info("compacted %s: %d documents up to sequence %d", path, self.snapshot.documents, seq)
        remove_leftovers(path)
        return self.refresh()

    def needs_compaction(self, fraction: float, min_docs: int) -> bool:
        """Whether the live segment and the deletions have grown past `fraction` of the base (and `min_docs`)."""
        changed = len(self._live) + int((~self._base_alive).sum())
        return changed >= max(min_docs, fraction * len(self._base_alive))

    @property
    def compacting(self) -> bool:
        return self._compact_lock.locked()

    def _reopen(self, index: OpenIndex, applied: int) -> None:
        """Continue on the compacted base: writes logged after `applied` are applied on top of it (lock held)."""
        self._start(index)
        self.seq = applied
        newer = [r for r in WriteAheadLog.replay(index.path / LIVE_DIR / WAL_FILE) if r["seq"] > applied]
        self._replay(newer)
        if self._wal is not None:  # keep only what the base does not hold yet
            self._wal.close()
            self._wal = WriteAheadLog.rewrite(index.path / LIVE_DIR / WAL_FILE, newer)
        self._dirty = True

    def stats(self) -> dict:
        snapshot = self.snapshot
        return {"documents": snapshot.documents, "base_documents": len(snapshot.base_alive),
                "deleted_base_documents": int((~snapshot.base_alive).sum()), "live_documents": len(snapshot.live),
                "last_sequence": self.seq, "visible_sequence": snapshot.seq}

    def close(self) -> None:
        if self._wal is not None:
            self._wal.close()
            self._wal = None


def repair_log(path: Path | str, dry_run: bool = False) -> Salvage:
    """Salvage the write-ahead log of the index at `path` (indexer.wal.salvage): keep every intact record that applies
    in order on the base, drop the rest, and say what was dropped. Takes the log's lock: stop the service first."""
    collection = Collection(open_index(path, verify="size", device="cpu"), max_batch_docs=2**31, replay=False)
    applied = collection.seq
    return salvage(collection.wal_path, lambda record: collection.apply_logged(record) if record["seq"] > applied else None,
                   dry_run)


def current_corpus(index: OpenIndex, base_alive: np.ndarray, live: list[LiveDocument], work: Path) -> tuple[Path, np.ndarray]:
    """The collection's documents as a JSONL corpus (alive base documents in order, then live ones) and their vectors."""
    corpus = work / "corpus.jsonl"
    alive = np.flatnonzero(base_alive)
    with corpus.open("w", encoding="utf-8") as fh:
        for i in alive:
            doc = index.docs.get(int(i))
            fh.write(json.dumps({"_id": doc["id"], "title": doc["title"], "text": doc["text"], "metadata": doc["metadata"]},
                                ensure_ascii=False) + "\n")
        for doc in live:
            fh.write(json.dumps({"_id": doc.doc_id, "title": doc.title, "text": doc.text, "metadata": doc.metadata},
                                ensure_ascii=False) + "\n")
    vectors = np.concatenate([np.asarray(index.embeddings[alive], dtype=np.float32),
                              np.stack([doc.vector for doc in live]) if live else np.empty((0, index.dense.dimension), np.float32)])
    return corpus, vectors


def build_options_of(index: OpenIndex) -> BuildOptions:
    """The build options the index was made with (the filterable fields it kept, when they were restricted)."""
    fields = index.manifest.metadata
    restricted = any(info.reason == "not listed in --filterable" for info in fields.values())
    return BuildOptions(model=index.manifest.embedder.model, backend=index.manifest.embedder.document_backend,
                        precision=index.manifest.embedder.document_precision,
                        analyzer=index.analyzer, bm25=index.manifest.bm25, faiss=index.manifest.faiss.params, device="cpu",
                        progress=False, filterable=tuple(n for n, i in fields.items() if i.filterable) if restricted else None)


def _carry_over(state: Snapshot, new: Manifest, folder: Path, vectors: np.ndarray) -> None:
    """What the compacted base (in `folder`, of `vectors`) keeps of the old: its tuned defaults and their evidence, and a
    fitted hubness correction, extended to the written documents (what a fresh fit with the same banks gives). A
    correction fitted before fits kept their banks cannot be extended: it is dropped (refit it)."""
    old = state.index.manifest
    new.defaults, new.evidence = old.defaults, dict(old.evidence)
    new.fusion_tuning, new.corpus, new.applied_sequence = old.fusion_tuning, old.corpus, state.seq
    if old.hubness is None:
        return
    if state.hubness is None:
        new.defaults = old.defaults.merge({"hubness": {"method": "none"}})
        new.evidence.pop("hubness", None)
        return
    alive = np.concatenate([state.base_alive, np.ones(len(state.live), dtype=bool)])
    correction, banks = state.hubness.compacted(state.index.hubness, alive)
    name = correction_folder_name()
    (folder / name).mkdir()
    write_correction(folder / name, correction, banks, vectors, old.faiss.params)
    new.files.update(file_inventory(folder / name, prefix=f"{name}/"))
    new.hubness = replace(old.hubness, folder=name, activation={b: int(m.sum()) for b, m in correction.activation.items()})


def check_batch(documents, max_batch_docs: int, types: dict[str, str | None]) -> list[dict]:
    """A write batch, checked whole and converted to what the log holds (so a logged record always applies):
    SpecError naming `documents[i].field` of the first problem. `types`: each metadata field's type in the collection
    (None: not filterable); a value its field cannot take is refused (decide_types settles the fields it adds)."""
    if not isinstance(documents, list) or not documents:
        raise SpecError("documents", "must be a non-empty list of documents")
    if len(documents) > max_batch_docs:
        raise SpecError("documents", f"at most {max_batch_docs} documents per batch (HYBRID_MAX_BATCH_DOCS), got {len(documents)}")
    seen: dict[str, int] = {}
    checked = []
    for i, doc in enumerate(documents):
        where = ("documents", i)
        if not isinstance(doc, dict):
            raise SpecError(where, "must be an object with id, text and optionally title and metadata")
        unknown = set(doc) - {"id", "title", "text", "metadata"}
        if unknown:
            raise SpecError((*where, sorted(unknown)[0]), "unknown field; valid: id, title, text, metadata")
        doc_id = check_id(doc.get("id"), (*where, "id"), written=True)
        if doc_id in seen:
            raise SpecError((*where, "id"), f"{doc_id!r} repeats documents[{seen[doc_id]}]: one version per id in a batch")
        seen[doc_id] = i
        if "text" not in doc or not isinstance(doc["text"], str):
            raise SpecError((*where, "text"), "required: a string")
        title = doc.get("title") or ""
        if not isinstance(title, str):
            raise SpecError((*where, "title"), "must be a string")
        for name, value in (("title", title), ("text", doc["text"])):
            if not encodable(value):
                raise SpecError((*where, name), "not valid Unicode (a lone surrogate such as \\ud800)")
        if not (doc["text"].strip() or title.strip()):
            raise SpecError((*where, "text"), "the document has neither text nor title")
        metadata = doc.get("metadata") or {}
        if not isinstance(metadata, dict):
            raise SpecError((*where, "metadata"), "must be an object")
        converted = {}
        for name, value in metadata.items():
            if not encodable(name):
                raise SpecError((*where, "metadata"), "a field name is not valid Unicode (a lone surrogate such as \\ud800)")
            converted[name] = written_value(types.get(name), value, (*where, "metadata", name))[0]
        checked.append({"id": doc_id, "title": title, "text": doc["text"], "metadata": converted})
    return checked


def decide_types(documents: list[dict], types: dict[str, str | None], restricted: bool) -> dict[str, str | None]:
    """The types of the metadata fields these (checked) documents add to a collection whose fields have `types`: a new
    field takes the type of its first value (not filterable when the index restricts its filterable fields, or for a
    reserved `$` name); SpecError naming the value when a field's type cannot take it."""
    added: dict[str, str | None] = {}
    for i, doc in enumerate(documents):
        for name, value in doc["metadata"].items():
            known = types[name] if name in types else added.get(name)
            kind = written_value(known, value, ("documents", i, "metadata", name))[1]
            if kind is not None and name not in types and name not in added:
                added[name] = None if restricted or name.startswith("$") else type_of_kind(kind)
    return added


def check_ids(ids) -> list[str]:
    """The ids of a delete, checked (SpecError naming `ids[i]`)."""
    if not isinstance(ids, list) or not ids:
        raise SpecError("ids", "must be a non-empty list of document ids")
    return [check_id(doc_id, ("ids", i)) for i, doc_id in enumerate(ids)]


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def check_id(doc_id, where, written: bool = False) -> str:
    """A document id: a non-empty string (or integer) of at most MAX_ID_BYTES of UTF-8; one `written` now also without
    control characters and not `.` or `..` (a URL path cannot carry those). Any other character, `/` included, is
    addressed percent-encoded in `/documents/{id}`."""
    if isinstance(doc_id, int) and not isinstance(doc_id, bool) and doc_id.bit_length() > 3 * MAX_ID_BYTES:
        raise SpecError(where, f"at most {MAX_ID_BYTES} bytes in UTF-8")  # (str() refuses integers of 4,300+ digits)
    if isinstance(doc_id, bool) or not isinstance(doc_id, (str, int)) or str(doc_id).strip() == "":
        raise SpecError(where, "required: a non-empty string (or integer) id")
    doc_id = str(doc_id)
    if not encodable(doc_id):
        raise SpecError(where, "not valid Unicode (a lone surrogate such as \\ud800)")
    size = len(doc_id.encode("utf-8"))
    if size > MAX_ID_BYTES:
        raise SpecError(where, f"at most {MAX_ID_BYTES} bytes in UTF-8, got {size}")
    if written and (_CONTROL.search(doc_id) or doc_id in (".", "..")):
        raise SpecError(where, "an id may not hold control characters, nor be . or ..")
    return doc_id
