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
from dataclasses import replace
from pathlib import Path

import faiss
import numpy as np

from common.publish import publish_dir, write_atomic
from indexer import store
from indexer.corpus import indexed_text
from indexer.manifest import IndexOpenError, read_json, read_manifest, write_manifest
from models.embedder import OnnxEmbedder
from models.onnx_export import resolve_query_precision
from models.providers import on_gpu
from search.bm25 import BM25Index
from search.dense import build_faiss_index
from search.errors import ConfigError, HybridError
from search.hubness import HubnessCorrection, augment_documents
from search.hits import Presenter
from search.pipeline import Stopwatch
from search.postings import Postings
from search.rerank import Reranker
from search.sharded import ShardedColumns, ShardedHubness, ShardedPipeline, ShardGroup
from search.spec import HubnessSpec

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
    from indexer.live import current_view  # the live-writes layer sits above the store

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


class ShardSearcher:
    """One shard's half of a sharded search (search.sharded.ShardClient), over an opened shard folder. Answers use the
    whole index's numbering (positions); everything passed in and out is plain data, so it can cross processes."""

    def __init__(self, index: store.OpenIndex):
        if index.manifest.shard is None:
            raise IndexOpenError(f"{index.path} is not a shard (its manifest has no shard section)")
        self.index = index
        self.positions = np.load(index.path / POSITIONS)
        if len(self.positions) != index.num_docs:
            raise IndexOpenError(f"{index.path}: {POSITIONS} has {len(self.positions)} entries for {index.num_docs} documents")
        # fusion, rerank and the defaults are the coordinator's: a shard only runs legs
        self.pipeline = index.pipeline()

    def describe(self) -> dict:
        hubness = self.index.hubness
        return {"shard": self.index.manifest.shard, "created_at": self.index.manifest.created_at,
                "documents": self.index.num_docs, "positions": self.positions,
                "max_bias": hubness.correction.max_bias if hubness is not None else None}

    def _local(self, positions) -> np.ndarray:
        positions = np.asarray(positions, dtype=np.int64)
        local = np.searchsorted(self.positions, positions)
        if len(positions) and (local.max() >= len(self.positions) or not np.array_equal(self.positions[local], positions)):
            raise KeyError("positions not in this shard")
        return local

    def _global(self, ranking) -> dict:
        return {"positions": self.positions[ranking.doc_idx], "scores": ranking.scores}

    def search(self, request: dict) -> dict:
        """One leg (mode bm25 or dense: its local top-`depth`), or both (hybrid: the local candidates, each with both
        scores, and each leg's local list) of the documents the request's filter admits."""

        pipe, clock = self.pipeline, Stopwatch()
        allowed = pipe.allowed(request["filter"])
        query, depth, coef = request["query"], request["depth"], request["coef"]
        hubness = HubnessSpec(method=request.get("hubness", "none"))
        if request["mode"] == "bm25":
            return self._global(pipe.bm25_leg(query, depth, clock, allowed)[1])
        if request["mode"] == "dense":
            return self._global(pipe.dense_leg(query, depth, clock, hubness, allowed, request["vector"], coef)[1])
        candidates, _ = pipe.candidates(query, depth, hubness, clock, allowed, request["vector"], coef)
        legs = {leg: self._global(ranking) for leg, ranking in candidates.rankings.items()}
        return {"positions": self.positions[candidates.doc_idx], "scores": candidates.scores, **legs}

    def raw_top1(self, vector: np.ndarray) -> dict | None:
        top = self.index.hubness.raw_top1(vector, self.index.embeddings)
        if top is None:
            return None
        activation = self.index.hubness.correction.activation
        return {"position": int(self.positions[top[0]]), "score": top[1],
                **{bank: bool(activation[bank][top[0]]) for bank in ("query", "gallery")}}

    def documents(self, positions) -> list[dict]:
        return [self.index.docs.get(int(i)) for i in self._local(positions)]

    def document_by_id(self, doc_id: str) -> dict | None:
        return self.index.document_by_id(doc_id)

    def facet_counts(self, names: list[str], positions) -> dict[str, list]:
        local = self._local(positions)
        return {name: self.index.metadata.columns[name].counts(local) for name in names}

    def close(self) -> None:
        self.index.close()


class ShardedIndex:
    """The coordinator's side of a sharded index: what the service and `hybrid search` use in place of an OpenIndex
    (pipeline, presenter, manifest, embedder), with the shards answering through `clients` (in process: ShardSearcher;
    Ray Serve deployments: cluster.serve). Queries are embedded here, once, with the index's model."""

    read_only_reason = "a sharded index takes no writes: write to the whole index, then split it again (`hybrid shard`)"

    def __init__(self, folder: Path | str, clients: list, device: str = "auto", query_precision: str = "auto",
                 own: list | None = None, verify: str = "full"):
        self.path = Path(folder)
        self.info = read_shards(self.path)
        store.verify_inventory(self.path, self.info["model_files"], verify)  # the query model is the shards' model
        if len(clients) != len(self.info["shards"]):
            raise IndexOpenError(f"{self.path} has {len(self.info['shards'])} shards, {len(clients)} clients were given")
        first = read_manifest(self.path / self.info["shards"][0]["folder"])
        if first.embedder.model_checksum != self.info["model_checksum"]:
            raise IndexOpenError(f"{self.path}: shard-000 was embedded with another model than {SHARDS_FILE} names: split again")
        self.manifest = replace(first, counts={**first.counts, "documents": self.info["documents"]},
                                shard={"shards": len(clients), "hash": self.info["hash"]})
        self.analyzer = first.analyzer
        self.shards = ShardGroup(clients)
        self._own = own or []  # shards opened in this process, closed with it
        described = self.shards.all("describe")
        self.owner = np.full(self.info["documents"], -1, dtype=np.int32)
        for i, shard in enumerate(described):
            if shard["shard"]["index"] != i or shard["shard"]["corpus_documents"] != self.info["documents"]:
                raise IndexOpenError(f"{self.path}: shard {i} answers as shard {shard['shard']['index']} of a "
                                     f"{shard['shard']['corpus_documents']}-document index")
            self.owner[shard["positions"]] = i
        if (self.owner < 0).any():
            raise IndexOpenError(f"{self.path}: {int((self.owner < 0).sum())} documents belong to no shard")
        self.embedder = OnnxEmbedder(self.path / store.MODEL_DIR, device=device,
                                     precision=first.embedder.document_precision)
        self.query_precision = resolve_query_precision(query_precision, self.path / store.MODEL_DIR, on_gpu(self.embedder))
        self.hubness = None
        if first.hubness is not None:
            biases = [shard["max_bias"] for shard in described if shard["max_bias"] is not None]
            self.hubness = ShardedHubness(first.hubness.params, {name: max(b[name] for b in biases) for name in biases[0]})
        self.metadata = None
        if any(info.filterable for info in first.metadata.values()):
            self.metadata = ShardedColumns(first.metadata, self.shards, lambda docs: self.owner[docs])

    @property
    def num_docs(self) -> int:
        return self.info["documents"]

    @functools.cached_property
    def query_embedder(self):
        if self.query_precision == self.manifest.embedder.document_precision:
            return self.embedder
        return OnnxEmbedder(self.path / store.MODEL_DIR, device="cpu", precision=self.query_precision)

    def document(self, position: int) -> dict:
        return self.documents(np.array([position]))[0]

    def documents(self, positions: np.ndarray) -> list[dict]:
        """Stored documents by position: one call to each shard that holds some."""
        positions = np.asarray(positions, dtype=np.int64)
        owners = self.owner[positions]
        answers = self.shards.some("documents", {int(i): (positions[owners == i],) for i in np.unique(owners)})
        taken = {int(i): iter(docs) for i, docs in answers.items()}
        return [next(taken[int(i)]) for i in owners]

    def doc_texts(self, positions: np.ndarray) -> list[str]:
        return [indexed_text(doc["title"], doc["text"]) for doc in self.documents(positions)]

    def document_by_id(self, doc_id: str) -> dict | None:
        """The stored document with this id, from the shard its hash names."""
        return self.shards.clients[int(shard_of([doc_id], len(self.shards))[0])].document_by_id(doc_id)

    def pipeline(self, overrides: dict | None = None, executor=None, cross_encoder=None, cross_encoder_name: str = "",
                 embedder=None):

        reranker = (Reranker(cross_encoder, None, cross_encoder_name, texts_of=self.doc_texts)
                    if cross_encoder is not None else None)
        return ShardedPipeline(self.shards, embedder or self.query_embedder, self.manifest.defaults.merge(overrides),
                               self.hubness, self.metadata, reranker)

    def presenter(self, embedder=None):

        return Presenter(self.document, self.analyzer, embedder or self.embedder, list(self.manifest.metadata), self.metadata,
                         documents=self.documents)

    def close(self) -> None:
        for searcher in self._own:
            searcher.close()
        self.shards.close()


def open_sharded(folder: Path | str, verify: str = "full", device: str = "auto", query_precision: str = "auto") -> ShardedIndex:
    """A sharded index with every shard opened in this process (the Ray Serve deployment opens them in replicas)."""
    folder = Path(folder)
    info = read_shards(folder)
    searchers = [ShardSearcher(store.open_index(folder / shard["folder"], verify=verify, device=device,
                                                query_precision=query_precision)) for shard in info["shards"]]
    return ShardedIndex(folder, searchers, device, query_precision, own=searchers, verify=verify)


def open_any(folder: Path | str, verify: str = "full", device: str = "auto", query_precision: str = "auto"):
    """The index at `folder`, whole (indexer.store.open_index) or sharded (open_sharded)."""
    if is_sharded(folder):
        return open_sharded(folder, verify, device, query_precision)
    return store.open_index(folder, verify=verify, device=device, query_precision=query_precision)
