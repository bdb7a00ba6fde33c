"""A sharded index: an index's documents split by a stable hash of their id into N shard folders.

Layout:
    shards.json            what was split, how, and each shard's folder, document count and positions checksum
    shard-000/ ...         a complete index folder (indexer.store) holding that shard's documents, plus
        positions.npy      int64: each document's position in the whole index (the corpus order), ascending

Each shard has its own BM25 and FAISS index, but its BM25 scores use the **corpus-wide** statistics (document
count, average length, document frequencies; the Lucene variant, search.postings), so a document scores the same
whatever shard holds it, and a fitted hubness correction keeps each document's biases and activation (they are
per-document quantities of the whole corpus). Positions keep the whole index's numbering, so a merge of the
shards' rankings breaks ties exactly as the unsharded index does (search.sharded).

A shard is made from a built index (`split_index`, `hybrid shard`; `hybrid index --shards N` builds then splits):
nothing is embedded again. The folder is published atomically, like a build.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import shutil
import threading
from dataclasses import dataclass, replace
from pathlib import Path

import faiss
import numpy as np

from hybrid_retrieval.common.publish import publish_dir, write_atomic
from hybrid_retrieval.indexer import store
from hybrid_retrieval.indexer.corpus import indexed_text
from hybrid_retrieval.indexer.live.collection import Collection, current_view
from hybrid_retrieval.indexer.live.snapshot import Snapshot
from hybrid_retrieval.indexer.live.validate import check_batch, check_ids, decide_types, restricted_fields
from hybrid_retrieval.indexer.manifest import IndexOpenError, read_json, read_manifest, write_manifest
from hybrid_retrieval.models.embedder import OnnxEmbedder
from hybrid_retrieval.models.onnx_export import resolve_precision
from hybrid_retrieval.models.providers import on_gpu
from hybrid_retrieval.search.bm25 import BM25Index
from hybrid_retrieval.search.dense import build_faiss_index
from hybrid_retrieval.search.errors import ConfigError, HybridError, StorageError
from hybrid_retrieval.search.hubness import HubnessCorrection, augment_documents
from hybrid_retrieval.search.hits import Presenter
from hybrid_retrieval.search.pipeline import SearchPipeline, Stopwatch
from hybrid_retrieval.search.postings import POSTINGS_DIR, Postings
from hybrid_retrieval.search.rerank import Reranker
from hybrid_retrieval.search.segments import CorpusStatistics, LiveBM25, LiveSegment
from hybrid_retrieval.search.sharded import ShardedColumns, ShardedHubness, ShardedPipeline, ShardGroup, by_owner
from hybrid_retrieval.search.spec import HubnessSpec

logger = logging.getLogger(__name__)

SHARDS_FILE = "shards.json"
SHARDS_FORMAT = "hybrid-retrieval-shards"
SHARDS_FORMAT_VERSION = 1
POSITIONS = "positions.npy"
HASH = "blake2b-64(utf-8 id) mod shards"
MAX_SHARDS = 1024


def shard_of(doc_ids: list[str], shards: int) -> np.ndarray:
    """The shard of each id: a stable hash (the same on every machine and Python run, unlike hash())."""
    return np.fromiter((int.from_bytes(hashlib.blake2b(doc_id.encode(), digest_size=8).digest(), "big") % shards
                        for doc_id in doc_ids), dtype=np.int64, count=len(doc_ids))


def shard_folder(i: int) -> str:
    return f"shard-{i:03d}"


def is_sharded(folder: Path | str) -> bool:
    return (Path(folder) / SHARDS_FILE).is_file()


def read_shards(folder: Path | str) -> dict:
    """The shards.json of a sharded index, after checking its format."""
    path = Path(folder) / SHARDS_FILE
    data = read_json(path, f"{folder} is not a sharded index: no {SHARDS_FILE} (make one with `hybrid shard`)")
    if not isinstance(data, dict) or data.get("format") != SHARDS_FORMAT or data.get("format_version") != SHARDS_FORMAT_VERSION:
        raise IndexOpenError(f"{path}: not a {SHARDS_FORMAT} file of version {SHARDS_FORMAT_VERSION}")
    return data


def check_shard_count(shards) -> int:
    if isinstance(shards, bool) or not isinstance(shards, int) or not 1 <= shards <= MAX_SHARDS:
        raise ConfigError(f"the number of shards must be an integer from 1 to {MAX_SHARDS}, got {shards!r}")
    return shards


def split_index(source: Path | str, out: Path | str, shards: int, verify: str = "full") -> dict:
    """Split the index at `source` into `shards` shards at `out` (replacing a sharded index there); returns shards.json."""
    check_shard_count(shards)
    source, out = Path(source).resolve(), Path(out).resolve()
    if out == source:
        raise ConfigError("the sharded index must go to another folder than its source")
    if out.exists() and not is_sharded(out):
        raise HybridError(f"{out} exists and is not a sharded index: refusing to replace it")
    index = store.open_index(source, verify=verify, device="cpu", query_precision="fp32")
    try:
        manifest = index.manifest
        if manifest.bm25.method != "lucene":
            raise ConfigError(f"sharding keeps corpus-wide BM25 statistics for the lucene method only; {source} was built "
                              f"with {manifest.bm25.method!r}: rebuild it with --bm25-method lucene")
        if manifest.shard is not None:
            raise ConfigError(f"{source} is itself a shard: split the whole index instead")
        _check_no_pending_writes(index)
        owner = shard_of(index.doc_ids, shards)
        empty = np.flatnonzero(np.bincount(owner, minlength=shards) == 0)
        if len(empty):  # nothing could ever be written to it: a sharded index is read-only
            raise ConfigError(f"{shards} shards of {index.num_docs} documents would leave shard(s) "
                              f"{', '.join(map(str, empty[:10]))} empty: use fewer shards")
        postings = index.postings
        stats = {"documents": index.num_docs, "avgdl": float(np.mean(postings.lengths)) if index.num_docs else 0.0}
        df = dict(zip(index.bm25.vocabulary, postings.document_frequency()[list(index.bm25.vocabulary.values())].tolist()))
        out.parent.mkdir(parents=True, exist_ok=True)
        with publish_dir(out) as tmp:
            listing = []
            for i in range(shards):
                positions = np.flatnonzero(owner == i).astype(np.int64)
                folder = tmp / shard_folder(i)
                folder.mkdir()
                _write_shard(index, positions, folder, df, stats, {"index": i, "shards": shards, "hash": HASH})
                listing.append({"folder": shard_folder(i), "documents": int(len(positions)),
                                "positions_sha256": store.sha256_file(folder / POSITIONS)})
                logger.info("shard %d of %d: %d documents", i + 1, shards, len(positions))
            shutil.copytree(index.path / store.MODEL_DIR, tmp / store.MODEL_DIR)  # what the coordinator embeds queries with
            info = {"format": SHARDS_FORMAT, "format_version": SHARDS_FORMAT_VERSION, "hash": HASH,
                    "documents": index.num_docs, "bm25_statistics": stats, "source": str(source),
                    "source_created_at": manifest.created_at, "model": manifest.embedder.model,
                    "model_checksum": manifest.embedder.model_checksum,
                    "model_files": store.file_inventory(tmp / store.MODEL_DIR, prefix=f"{store.MODEL_DIR}/"), "shards": listing}
            write_atomic(tmp / SHARDS_FILE, json.dumps(info, indent=2))
    finally:
        index.close()
    return info


def _check_no_pending_writes(index: store.OpenIndex) -> None:
    """Writes in the index's log that no compaction folded into it yet would be lost by the split."""
    view = current_view(index)
    if view is not index and view.changed:
        raise HybridError(f"{index.path} has live writes that are not compacted into it yet: compact it first "
                          "(POST /admin/compact), then split it")


def _write_shard(index: store.OpenIndex, positions: np.ndarray, folder: Path, df: dict[str, int], stats: dict,
                 shard: dict) -> None:
    """One shard's folder: its documents, BM25 with corpus-wide statistics, vectors, FAISS, metadata, hubness."""
    manifest = index.manifest
    writer = store.DocStoreWriter(folder)
    tokens = []
    try:
        for position in positions:
            doc = index.docs.get(int(position))
            writer.add(doc["id"], doc["title"], doc["text"], doc["metadata"])
            tokens.append(index.analyzer.analyze(indexed_text(doc["title"], doc["text"])))
    finally:
        writer.close()
    bm25 = global_bm25(tokens, index.analyzer, manifest.bm25, df, stats)
    bm25.save(folder / store.BM25_DIR)
    Postings.from_tokens(tokens, bm25.vocabulary).save(folder)  # what writes score with (search.segments.LiveBM25)
    np.save(folder / POSITIONS, positions)
    vectors = np.ascontiguousarray(index.embeddings[positions], dtype=np.float32)
    np.save(folder / store.EMBEDDINGS, vectors)
    faiss.write_index(build_faiss_index(vectors, manifest.faiss.params, "cpu"), str(folder / store.FAISS_FILE))
    shutil.copytree(index.path / store.MODEL_DIR, folder / store.MODEL_DIR)
    if index.metadata is not None:
        index.metadata.take(positions).save(folder)
    if index.hubness is not None:
        _write_hubness(index, positions, vectors, folder / manifest.hubness.folder)
    stats_of_shard = {**shard, "corpus_documents": stats["documents"], "corpus_avgdl": stats["avgdl"]}
    write_manifest(folder, replace(
        manifest, counts={"documents": int(len(positions)), "bm25_vocabulary": bm25.vocabulary_size},
        files=store.file_inventory(folder), shard=stats_of_shard, applied_sequence=0))


def _write_hubness(index: store.OpenIndex, positions: np.ndarray, vectors: np.ndarray, folder: Path) -> None:
    """The shard's slice of the fitted correction: each document's biases and activation, and the augmented index.
    The banks stay with the whole index: a shard takes no writes, so it never extends the correction."""
    folder.mkdir()
    full = index.hubness.correction
    part = HubnessCorrection(full.params, {name: np.asarray(lse)[positions] for name, lse in full.lse.items()},
                             {bank: np.asarray(mask)[positions] for bank, mask in full.activation.items()})
    for column, lse in part.lse.items():
        np.save(folder / f"{column}.npy", lse)
    for bank, mask in part.activation.items():
        np.save(folder / f"activation_{bank}.npy", mask)
    augmented = build_faiss_index(augment_documents(vectors, part), index.manifest.faiss.params, "cpu")
    faiss.write_index(augmented, str(folder / store.AUGMENTED_FAISS))


def global_bm25(tokens: list[list[str]], analyzer, params, df: dict[str, int], stats: dict) -> BM25Index:
    """BM25 (Lucene variant) over `tokens` whose scores use the whole corpus's statistics: `df` (term -> document
    frequency), stats["documents"] and stats["avgdl"]. bm25s lays out the sparse matrix; its values are replaced by
        idf(t) * tf / (tf + k1 * (1 - b + b * |d| / avgdl)),   idf(t) = ln(1 + (N - df + 0.5) / (df + 0.5))."""
    bm25 = BM25Index.build(tokens, analyzer, params)
    engine = bm25.engine
    postings = Postings.from_tokens(tokens, bm25.vocabulary)
    indptr = np.asarray(engine.scores["indptr"])  # bm25s's vocabulary ends with "", which has no column
    if not np.array_equal(indptr, postings.indptr[: len(indptr)]) or not np.array_equal(
            np.asarray(engine.scores["indices"]), postings.docs):
        raise HybridError("bm25s laid out its score matrix in an unexpected order: cannot apply corpus-wide statistics")
    terms = sorted(bm25.vocabulary, key=bm25.vocabulary.get)[: len(indptr) - 1]
    n, avgdl = stats["documents"], stats["avgdl"]
    term_df = np.array([df[t] for t in terms], dtype=np.float64)
    idf = np.log(1.0 + (n - term_df + 0.5) / (term_df + 0.5))
    tf = postings.tfs.astype(np.float64)
    lengths = postings.lengths.astype(np.float64)[postings.docs]
    norm = params.k1 * (1.0 - params.b + params.b * lengths / avgdl)
    engine.scores["data"] = (np.repeat(idf, np.diff(indptr)) * tf / (tf + norm)).astype(np.float32)
    return bm25


def base_positions(index: store.OpenIndex) -> np.ndarray:
    """The position in the whole index of each document of a shard's base segment."""
    positions = np.load(index.path / POSITIONS)
    if len(positions) != index.num_docs:
        raise IndexOpenError(f"{index.path}: {POSITIONS} has {len(positions)} entries for {index.num_docs} documents")
    return positions


@dataclass(frozen=True)
class _ShardView:
    """What a shard's searches read, as of one snapshot: its pipeline, and the position of each document (base then
    live numbering)."""

    key: object  # the snapshot (or the index, for a shard without a collection) this view was made of
    index: store.OpenIndex
    snapshot: Snapshot | None
    pipeline: SearchPipeline
    positions: np.ndarray

    @classmethod
    def of(cls, index: store.OpenIndex, snapshot: Snapshot | None, positions: np.ndarray) -> "_ShardView":
        """`positions`: the base documents' (base_positions)."""
        if snapshot is None:
            return cls(index, index, None, index.pipeline(), positions)
        live = np.array([doc.position for doc in snapshot.live.docs], dtype=np.int64)
        # fusion, rerank and the defaults are the coordinator's: a shard only runs legs
        return cls(snapshot, index, snapshot, snapshot.pipeline(), np.concatenate([positions, live]))

    @functools.cached_property
    def bm25(self) -> LiveBM25:
        """BM25 over the documents that exist, to score with the whole corpus's statistics (a changed snapshot's
        pipeline already has it)."""
        if isinstance(self.pipeline.bm25, LiveBM25):
            return self.pipeline.bm25
        snapshot = self.snapshot
        alive = snapshot.base_alive if snapshot is not None else np.ones(self.index.num_docs, dtype=bool)
        live = snapshot.live if snapshot is not None else LiveSegment([], self.index.dense.dimension, {})
        return LiveBM25(self.index.bm25, self.index.postings, self.index.manifest.bm25, alive, live)

    def local(self, positions) -> tuple[np.ndarray, np.ndarray]:
        """The local number of each of `positions`, and whether this shard holds it."""
        positions = np.asarray(positions, dtype=np.int64)
        if not len(self.positions):
            return np.zeros(len(positions), dtype=np.int64), np.zeros(len(positions), dtype=bool)
        local = np.minimum(np.searchsorted(self.positions, positions), len(self.positions) - 1)
        return local, self.positions[local] == positions

    def document(self, local: int) -> dict:
        return self.snapshot.document(local) if self.snapshot is not None else self.index.docs.get(local)


class ShardSearcher:
    """One shard's half of a sharded search (search.sharded.ShardClient), over an opened shard folder, and the shard's
    writes when it has a `collection` (indexer.live: the writer's, or a follower's that `follow` keeps up with the
    writer's log). Answers use the whole index's numbering (positions); everything passed in and out is plain data,
    so it can cross processes."""

    def __init__(self, index: store.OpenIndex, collection: Collection | None = None):
        if index.manifest.shard is None:
            raise IndexOpenError(f"{index.path} is not a shard (its manifest has no shard section)")
        self.index, self.collection = index, collection
        if collection is not None:
            collection.on_compact = _keep_positions
        self._base = (index, base_positions(index))
        self._view = _ShardView.of(index, collection.snapshot if collection is not None else None, self._base[1])

    def view(self, min_seq: list[int] | int = 0) -> _ShardView:
        """The current view, after catching up with the writer's log when it is older than `min_seq` (a follower;
        a list: by shard, this shard's entry)."""
        collection = self.collection
        if collection is None:
            return self._view
        if isinstance(min_seq, list):
            min_seq = min_seq[self.index.manifest.shard["index"]]
        snapshot = collection.snapshot
        if snapshot.seq < min_seq:
            snapshot = collection.follow(up_to=min_seq) if collection.seq < min_seq else collection.refresh()
        view = self._view
        if view.key is not snapshot:
            if self._base[0] is not snapshot.index:  # a compaction's new base: read its positions once, as it opens
                self._base = (snapshot.index, base_positions(snapshot.index))
            view = self._view = _ShardView.of(snapshot.index, snapshot, self._base[1])
        return view

    def describe(self) -> dict:
        if self.collection is not None:  # what it applied, published: a coordinator numbers new writes after them
            self.collection.refresh()
        view = self.view()
        hubness = view.index.hubness
        written = view.index.manifest.applied_sequence > 0 or (self.collection is not None and self.collection.seq > 0)
        return {"shard": view.index.manifest.shard, "created_at": view.index.manifest.created_at,
                "documents_alive": view.snapshot.documents if view.snapshot is not None else view.index.num_docs,
                "positions": view.positions, "written": written,
                "seq": self.collection.seq if self.collection is not None else 0,
                "max_bias": hubness.correction.max_bias if hubness is not None else None}

    @staticmethod
    def _global(view: _ShardView, ranking) -> dict:
        return {"positions": view.positions[ranking.doc_idx], "scores": ranking.scores}

    def search(self, request: dict) -> dict:
        """One leg (mode bm25 or dense: its local top-`depth`), or both (hybrid: the local candidates, each with both
        scores, and each leg's local list) of the documents the request's filter admits. BM25 scores with the
        request's corpus statistics when it has them (a sharded index that took writes)."""
        view, clock = self.view(request.get("min_seq", 0)), Stopwatch()
        pipe = view.pipeline
        if request.get("statistics") is not None:
            pipe = pipe.with_bm25(view.bm25.with_statistics(request["statistics"]))
        allowed = pipe.allowed(request["filter"])
        query, depth, coef = request["query"], request["depth"], request["coef"]
        hubness = HubnessSpec(method=request.get("hubness", "none"))
        if request["mode"] == "bm25":
            return self._global(view, pipe.bm25_leg(query, depth, clock, allowed)[1])
        if request["mode"] == "dense":
            return self._global(view, pipe.dense_leg(query, depth, clock, hubness, allowed, request["vector"], coef)[1])
        candidates, _ = pipe.candidates(query, depth, hubness, clock, allowed, request["vector"], coef)
        legs = {leg: self._global(view, ranking) for leg, ranking in candidates.rankings.items()}
        return {"positions": view.positions[candidates.doc_idx], "scores": candidates.scores, **legs}

    def statistics(self, terms: list[str], min_seq: list[int] | int = 0) -> CorpusStatistics:
        """This shard's part of the corpus statistics (search.segments.CorpusStatistics)."""
        return self.view(min_seq).bm25.statistics(terms)

    def raw_top1(self, vector: np.ndarray) -> dict | None:
        view = self.view()
        top = view.index.hubness.raw_top1(vector, view.index.embeddings)
        if top is None:
            return None
        activation = view.index.hubness.correction.activation
        return {"position": int(view.positions[top[0]]), "score": top[1],
                **{bank: bool(activation[bank][top[0]]) for bank in ("query", "gallery")}}

    def documents(self, positions, min_seq: list[int] | int = 0) -> list[dict | None]:
        """The stored documents at `positions`; None for a position this shard does not hold."""
        view = self.view(min_seq)
        local, held = view.local(positions)
        return [view.document(int(i)) if h else None for i, h in zip(local, held)]

    def document_by_id(self, doc_id: str) -> dict | None:
        """The latest acknowledged version of a document (read-your-writes, before any refresh)."""
        return self.collection.get(doc_id) if self.collection is not None else self.index.document_by_id(doc_id)

    def facet_counts(self, names: list[str], positions, min_seq: list[int] | int = 0) -> dict[str, list]:
        """Facet counts over the documents at `positions` that this shard holds."""
        view = self.view(min_seq)
        local, held = view.local(positions)
        local = local[held]
        metadata = view.snapshot.metadata if view.snapshot is not None else view.index.metadata
        return {name: metadata.columns[name].counts(local) for name in names}

    # writes (the shard's writer)

    def upsert(self, documents: list[dict], positions: list[int]) -> int:
        """Written documents keep the order they were written in: their positions follow every one this shard holds."""
        collection = self._writer()
        self.view()  # the base as published (a compaction's new one)
        last = max(int(np.max(self._base[1], initial=-1)), collection.last_position)
        if len(positions) and min(positions) <= last:
            raise HybridError(f"positions must follow the last one this shard holds ({last}), got {min(positions)}")
        return collection.upsert(documents, positions)

    def delete(self, ids: list[str]) -> int:
        return self._writer().delete(ids)

    def refresh(self) -> int:
        return self._writer().refresh().seq

    def needs_compaction(self, fraction: float, min_docs: int) -> bool:
        return self._writer().needs_compaction(fraction, min_docs)

    def compact(self) -> int:
        return self._writer().compact().seq

    def stats(self) -> dict:
        return self._writer().stats()

    def field_types(self) -> dict:
        return self._writer().field_types()

    def _writer(self) -> Collection:
        if self.collection is None:
            raise HybridError(f"{self.index.path} was opened read-only")
        return self.collection

    def close(self) -> None:
        if self.collection is not None:
            self.collection.close()
        (self.collection.index if self.collection is not None else self.index).close()


def _keep_positions(state: Snapshot, manifest, folder: Path) -> None:
    """A shard's compaction keeps each document's position in the whole index (alive base documents in order, then
    live ones, as the compacted base numbers them) and its shard section."""
    base = base_positions(state.index)[state.base_alive]
    np.save(folder / POSITIONS, np.concatenate([base, np.array([doc.position for doc in state.live.docs], dtype=np.int64)]))
    manifest.files[POSITIONS] = {"bytes": (folder / POSITIONS).stat().st_size, "sha256": store.sha256_file(folder / POSITIONS)}
    manifest.shard = state.index.manifest.shard


class ShardedIndex:
    """The coordinator's side of a sharded index: what the service and `hybrid search` use in place of an OpenIndex
    (pipeline, presenter, manifest, embedder), with the shards answering through `clients` (in process: ShardSearcher;
    Ray Serve deployments: cluster.serve). Queries are embedded here, once, with the index's model.

    `writers` (one per shard, in shard order) take the writes (`collection`); without them, or when the shards cannot
    take writes, the index is read-only and `read_only_reason` says why. Once any shard has taken a write, the
    corpus's BM25 statistics are no longer the split's: each BM25 leg first sums the shards' statistics of the query's
    terms (search.segments.CorpusStatistics) and every shard scores with them, as Elasticsearch's DFS query does."""

    def __init__(self, folder: Path | str, clients: list, device: str = "auto", query_precision: str = "auto",
                 own: list | None = None, verify: str = "full", writers: list | None = None):
        self.path = Path(folder)
        self.info = read_shards(self.path)
        store.verify_inventory(self.path, self.info["model_files"], verify)  # the query model is the shards' model
        if len(clients) != len(self.info["shards"]) or (writers is not None and len(writers) != len(clients)):
            raise IndexOpenError(f"{self.path} has {len(self.info['shards'])} shards, {len(clients)} clients were given")
        first = read_manifest(self.path / self.info["shards"][0]["folder"])
        if first.embedder.model_checksum != self.info["model_checksum"]:
            raise IndexOpenError(f"{self.path}: shard-000 was embedded with another model than {SHARDS_FILE} names: split again")
        self.manifest = replace(first, counts={**first.counts, "documents": self.info["documents"]},
                                shard={"shards": len(clients), "hash": self.info["hash"]})
        self.analyzer = first.analyzer
        self.shards = ShardGroup(clients)
        # in process the writers are the searchers themselves: one group, one describe
        self.writers = self.shards if writers is clients else ShardGroup(writers) if writers is not None else None
        self._own = own or []  # shards opened in this process, closed with it
        described = self.shards.all("describe")
        split_documents = self.info["documents"]  # positions below it are the split's; written documents get later ones
        self.owner = np.full(split_documents, -1, dtype=np.int32)
        for i, shard in enumerate(described):
            if shard["shard"]["index"] != i or shard["shard"]["shards"] != len(clients):
                raise IndexOpenError(f"{self.path}: shard {i} answers as shard {shard['shard']['index']} of "
                                     f"{shard['shard']['shards']}")
            positions = np.asarray(shard["positions"])
            self.owner[positions[positions < split_documents]] = i
        # the writers know the latest writes (a search replica may not have caught up with them yet)
        latest = self.writers.all("describe") if self.writers not in (None, self.shards) else described
        self.written = any(shard["written"] for shard in latest)
        if not self.written and (self.owner < 0).any():
            raise IndexOpenError(f"{self.path}: {int((self.owner < 0).sum())} documents belong to no shard")
        # per shard, the writer's sequence number that searches must see (a replica catches up with its log first)
        self.visible = [int(shard["seq"]) for shard in latest]
        self.next_position = max([split_documents, *(int(np.max(d["positions"], initial=-1)) + 1 for d in latest)])
        self.documents_count = sum(int(shard["documents_alive"]) for shard in latest)
        self.embedder = OnnxEmbedder(self.path / store.MODEL_DIR, device=device,
                                     precision=first.embedder.document_precision)
        self.query_precision = resolve_precision(query_precision, self.path / store.MODEL_DIR, on_gpu(self.embedder))
        self.hubness = None
        if first.hubness is not None:
            biases = [shard["max_bias"] for shard in described if shard["max_bias"] is not None]
            self.hubness = ShardedHubness(first.hubness.params, {name: max(b[name] for b in biases) for name in biases[0]})
        self.metadata = None
        if any(info.filterable for info in first.metadata.values()):
            self.metadata = ShardedColumns(first.metadata, self.shards, self.owners, self.consistency)
        self.read_only_reason = self._read_only_reason()

    def _read_only_reason(self) -> str | None:
        if self.hubness is not None:
            return ("a sharded index with a fitted hubness correction takes no writes (its shards do not carry the banks "
                    "that extend it to new documents): split an index without one, or write to the whole index and split again")
        missing = [shard["folder"] for shard in self.info["shards"]
                   if not (self.path / shard["folder"] / POSTINGS_DIR).is_dir()]
        if missing:
            return f"{', '.join(missing[:3])} were split before shards took writes (no {POSTINGS_DIR}/): split the index again"
        return "this sharded index was opened read-only" if self.writers is None else None

    @property
    def num_docs(self) -> int:
        return self.info["documents"]

    @functools.cached_property
    def query_embedder(self):
        if self.query_precision == self.manifest.embedder.document_precision:
            return self.embedder
        return OnnxEmbedder(self.path / store.MODEL_DIR, device="cpu", precision=self.query_precision)

    def consistency(self, query: str | None = None) -> dict:
        """What a shard request carries once the index took writes: the writer sequence number each shard must have
        caught up with (`min_seq`, by shard) and, for a BM25 leg of `query`, the corpus statistics of its terms."""
        if not self.written:
            return {}
        extras: dict = {"min_seq": list(self.visible)}
        if query is not None:
            terms = self.analyzer.analyze(query)
            extras["statistics"] = CorpusStatistics.total(self.shards.all("statistics", terms, extras["min_seq"]))
        return extras

    def owners(self, positions: np.ndarray) -> np.ndarray:
        """The shard of each position (-1: written since the split, which shard is not recorded here)."""
        positions = np.asarray(positions, dtype=np.int64)
        out = np.full(len(positions), -1, dtype=np.int32)
        split = positions < len(self.owner)
        out[split] = self.owner[positions[split]]
        return out

    def document(self, position: int) -> dict:
        return self.documents(np.array([position]))[0]

    def documents(self, positions: np.ndarray) -> list[dict]:
        """Stored documents by position: one call to each shard that holds some (every shard, for written ones)."""
        positions = np.asarray(positions, dtype=np.int64)
        asked = by_owner(self.owners(positions), positions, len(self.shards))
        min_seq = self.consistency().get("min_seq", 0)
        answers = self.shards.some("documents", {i: (part, min_seq) for i, part in asked.items()})
        found: dict[int, dict] = {}
        for i, part in asked.items():
            found.update((int(p), doc) for p, doc in zip(part, answers[i]) if doc is not None)
        return [found[int(p)] for p in positions]

    def doc_texts(self, positions: np.ndarray) -> list[str]:
        return [indexed_text(doc["title"], doc["text"]) for doc in self.documents(positions)]

    def owner_of(self, doc_id: str) -> int:
        return int(shard_of([doc_id], len(self.shards))[0])

    def document_by_id(self, doc_id: str) -> dict | None:
        """The stored document with this id, from the shard its hash names."""
        return self.shards.clients[self.owner_of(doc_id)].document_by_id(doc_id)

    def pipeline(self, overrides: dict | None = None, executor=None, cross_encoder=None, cross_encoder_name: str = "",
                 embedder=None):
        reranker = (Reranker(cross_encoder, None, cross_encoder_name, texts_of=self.doc_texts)
                    if cross_encoder is not None else None)
        return ShardedPipeline(self.shards, embedder or self.query_embedder, self.manifest.defaults.merge(overrides),
                               self.hubness, self.metadata, reranker, self.consistency)

    def presenter(self, embedder=None):
        return Presenter(self.document, self.analyzer, embedder or self.embedder, list(self.manifest.metadata), self.metadata,
                         documents=self.documents)

    def close(self) -> None:
        for searcher in self._own:
            searcher.close()
        self.shards.close()
        if self.writers not in (None, self.shards):
            self.writers.close()


@dataclass(frozen=True)
class ShardedSnapshot:
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
        self.snapshot = ShardedSnapshot(index, sum(index.visible), index.documents_count)
        # each metadata field's type, decided once for the whole index (every write passes here first): a field a
        # write adds takes its first value's type in every shard
        self._restricted = restricted_fields(index.manifest.metadata)
        self._field_types: dict[str, str | None] = {}
        for types in index.writers.all("field_types"):
            for name, kind in types.items():
                self._field_types[name] = kind if self._field_types.get(name, kind) == kind else None

    @property
    def seq(self) -> int:
        return sum(self._acked)

    def upsert(self, documents: list) -> int:
        types = dict(self._field_types)
        checked = check_batch(documents, self.max_batch_docs, types)
        decide_types(checked, types, self._restricted)  # fail before any shard embeds; decided again below
        owners = shard_of([doc["id"] for doc in checked], len(self.index.shards))
        with self._lock:
            self._field_types.update(decide_types(checked, self._field_types, self._restricted))
            positions = np.arange(self.index.next_position, self.index.next_position + len(checked))
            parts = {int(s): ([checked[i] for i in np.flatnonzero(owners == s)], positions[owners == s].tolist())
                     for s in np.unique(owners)}
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

    def refresh(self) -> ShardedSnapshot:
        """Publish every shard's acknowledged writes; one refresh at a time, so visibility never goes back."""
        with self._refresh_lock:
            with self._lock:
                acked = list(self._acked)
            if acked == self.index.visible and self.snapshot.seq == sum(acked):
                return self.snapshot
            self.index.writers.all("refresh")
            self.index.visible = acked
            stats = self.index.writers.all("stats")
            snapshot = ShardedSnapshot(self.index, sum(acked), sum(s["documents"] for s in stats))
            if self.on_refresh is not None:
                self.on_refresh(snapshot)
            self.snapshot = snapshot
            return snapshot

    def wait_visible(self, seq: int, timeout: float) -> bool:
        return self.snapshot.seq >= seq  # a refresh publishes every shard at once: nothing to wait for after it

    def needs_compaction(self, fraction: float, min_docs: int) -> bool:
        return any(self.index.writers.all("needs_compaction", fraction, min_docs))

    @property
    def compacting(self) -> bool:
        return self._compact_lock.locked()

    def compact(self) -> ShardedSnapshot:
        """Compact every shard that changed (each in place, atomically, while writes continue)."""
        with self._compact_lock:
            self.index.writers.all("compact")
        return self.refresh()

    def stats(self) -> dict:
        parts = self.index.writers.all("stats")
        totals = {key: sum(part[key] for part in parts) for key in ("documents", "base_documents", "deleted_base_documents",
                                                                     "live_documents")}
        return {**totals, "last_sequence": self.seq, "visible_sequence": self.snapshot.seq}

    def close(self) -> None:
        """Release the shards' logs this process writes (a reload's new collection takes them over); on Ray the
        writer deployments keep theirs."""
        for writer in self.index.writers.clients:
            collection = getattr(writer, "collection", None)
            if collection is not None:
                collection.close()


def open_shard(folder: Path | str, verify: str = "full", device: str = "auto", query_precision: str = "fp32") -> ShardSearcher:
    """A shard folder, with its collection (the writes its log holds, and the next ones) when shards can take writes."""
    index = store.open_index(folder, verify=verify, device=device, query_precision=query_precision)
    writable = index.manifest.hubness is None and (index.path / POSTINGS_DIR).is_dir()
    # the coordinator limits a write batch (HYBRID_MAX_BATCH_DOCS); a shard takes whatever part of it is its own
    return ShardSearcher(index, Collection(index, max_batch_docs=2**31) if writable else None)


def open_sharded(folder: Path | str, verify: str = "full", device: str = "auto", query_precision: str = "auto") -> ShardedIndex:
    """A sharded index with every shard opened in this process, each its own writer (the Ray Serve deployment opens
    them in replicas: cluster.serve)."""
    folder = Path(folder)
    info = read_shards(folder)
    searchers = [open_shard(folder / shard["folder"], verify, device, query_precision) for shard in info["shards"]]
    writers = searchers if all(searcher.collection is not None for searcher in searchers) else None
    return ShardedIndex(folder, searchers, device, query_precision, own=searchers, verify=verify, writers=writers)


def open_any(folder: Path | str, verify: str = "full", device: str = "auto", query_precision: str = "auto"):
    """The index at `folder`, whole (indexer.store.open_index) or sharded (open_sharded)."""
    if is_sharded(folder):
        return open_sharded(folder, verify, device, query_precision)
    return store.open_index(folder, verify=verify, device=device, query_precision=query_precision)
