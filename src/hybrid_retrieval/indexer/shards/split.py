"""Splitting a built index into shards (`hybrid shard`, `hybrid index --shards N`): each shard a complete index folder
of the documents whose id hashes to it, scored with the whole corpus's BM25 statistics and keeping each document's
hubness biases; nothing is embedded again. The folder is published atomically, like a build.
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from hybrid_retrieval.common.errors import ConfigError, HybridError
from hybrid_retrieval.common.publish import link_or_copy, publish_dir, write_atomic
from hybrid_retrieval.indexer import store
from hybrid_retrieval.indexer.corpus import indexed_text
from hybrid_retrieval.indexer.live.collection import current_view
from hybrid_retrieval.indexer.live.view import ReadView
from hybrid_retrieval.indexer.manifest import write_manifest
from hybrid_retrieval.indexer.representation import save_unless_held
from hybrid_retrieval.indexer.shards.layout import (
    HASH,
    POSITIONS,
    SHARDS_FILE,
    SHARDS_FORMAT,
    SHARDS_FORMAT_VERSION,
    check_shard_count,
    is_sharded,
    shard_folder,
    shard_of,
)
from hybrid_retrieval.search.analyzer import Analyzer
from hybrid_retrieval.search.bm25 import BM25Index, BM25Params
from hybrid_retrieval.search.dense import FaissParams, build_faiss_index
from hybrid_retrieval.search.hubness import HubnessCorrection, augment_documents
from hybrid_retrieval.search.postings import Postings, PostingsBuilder

logger = logging.getLogger(__name__)


def split_index(source: Path | str, out: Path | str, shards: int, verify: str = "full") -> dict[str, Any]:
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
        owner = _owners(index, shards)
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
                listing.append(
                    {"folder": shard_folder(i), "documents": len(positions), "positions_sha256": store.sha256_file(folder / POSITIONS)}
                )
                logger.info("shard %d of %d: %d documents", i + 1, shards, len(positions))
            # what the coordinator embeds queries with
            shutil.copytree(index.path / store.MODEL_DIR, tmp / store.MODEL_DIR, copy_function=link_or_copy)
            info = {
                "format": SHARDS_FORMAT,
                "format_version": SHARDS_FORMAT_VERSION,
                "hash": HASH,
                "documents": index.num_docs,
                "bm25_statistics": stats,
                "source": str(source),
                "source_created_at": manifest.created_at,
                "model": manifest.embedder.model,
                "model_checksum": manifest.embedder.model_checksum,
                "model_files": store.file_inventory(tmp / store.MODEL_DIR, prefix=f"{store.MODEL_DIR}/"),
                "shards": listing,
            }
            write_atomic(tmp / SHARDS_FILE, json.dumps(info, indent=2))
    finally:
        index.close()
    return info


def _owners(index: store.OpenIndex, shards: int) -> np.ndarray:
    """The shard of each document, once the index is checked to split into `shards` shards that can each take writes."""
    manifest, source = index.manifest, index.path
    if manifest.bm25.method != "lucene":
        raise ConfigError(
            f"sharding keeps corpus-wide BM25 statistics for the lucene method only; {source} was built "
            f"with {manifest.bm25.method!r}: rebuild it with --bm25-method lucene"
        )
    if manifest.shard is not None:
        raise ConfigError(f"{source} is itself a shard: split the whole index instead")
    if manifest.chunking.enabled:
        raise ConfigError(f"{source} is chunked into passages, which shards do not hold: split an index built without --chunking")
    _check_no_pending_writes(index)
    owner = shard_of(index.doc_ids, shards)
    empty = np.flatnonzero(np.bincount(owner, minlength=shards) == 0)
    if len(empty):  # nothing could ever be written to it: a sharded index is read-only
        raise ConfigError(
            f"{shards} shards of {index.num_docs} documents would leave shard(s) {', '.join(map(str, empty[:10]))} empty: use fewer shards"
        )
    return owner


def _check_no_pending_writes(index: store.OpenIndex) -> None:
    """Writes in the index's log that no compaction folded into it yet would be lost by the split."""
    view = current_view(index)
    if isinstance(view, ReadView) and view.changed:
        raise HybridError(
            f"{index.path} has live writes that are not compacted into it yet: compact it first (POST /admin/compact), then split it"
        )


def _write_shard(
    index: store.OpenIndex, positions: np.ndarray, folder: Path, df: dict[str, int], stats: dict[str, float], shard: dict[str, Any]
) -> None:
    """One shard's folder: its documents, BM25 with corpus-wide statistics, vectors, FAISS, metadata, hubness."""
    manifest = index.manifest
    writer = store.DocStoreWriter(folder)
    terms = PostingsBuilder()
    try:
        for position in positions:
            doc = index.docs.get(int(position))
            writer.add(doc["id"], doc["title"], doc["text"], doc["metadata"])
            terms.add(index.analyzer.analyze(indexed_text(doc["title"], doc["text"])), index.analyzer.analyze(doc["title"]))
    finally:
        writer.close()
    postings, vocabulary = terms.finish()
    bm25 = global_bm25(postings, vocabulary, index.analyzer, manifest.bm25, df, stats)
    bm25.save(folder / store.BM25_DIR)
    postings.save(folder)  # what writes score with (search.segments.LiveBM25)
    np.save(folder / POSITIONS, positions)
    vectors = np.ascontiguousarray(index.embeddings[positions], dtype=np.float32)
    faiss.write_index(build_faiss_index(vectors, manifest.faiss.params, "cpu"), str(folder / store.FAISS_FILE))
    save_unless_held(folder / store.EMBEDDINGS, vectors, manifest.faiss.params)
    shutil.copytree(index.path / store.MODEL_DIR, folder / store.MODEL_DIR, copy_function=link_or_copy)
    if index.metadata is not None:
        index.metadata.take(positions).save(folder)
    if index.hubness is not None and manifest.hubness is not None:  # loaded together (indexer.store)
        _write_hubness(index.hubness.correction, positions, vectors, manifest.faiss.params, folder / manifest.hubness.folder)
    stats_of_shard = {**shard, "corpus_documents": stats["documents"], "corpus_avgdl": stats["avgdl"]}
    write_manifest(
        folder,
        replace(
            manifest,
            counts={"documents": len(positions), "bm25_vocabulary": bm25.vocabulary_size},
            files=store.file_inventory(folder),
            shard=stats_of_shard,
            applied_sequence=0,
        ),
    )


def _write_hubness(full: HubnessCorrection, positions: np.ndarray, vectors: np.ndarray, faiss_params: FaissParams, folder: Path) -> None:
    """The shard's slice of the fitted correction: each document's biases and activation, and the augmented index.
    The banks stay with the whole index: a shard takes no writes, so it never extends the correction."""
    folder.mkdir()
    part = HubnessCorrection(
        full.params,
        {name: np.asarray(lse)[positions] for name, lse in full.lse.items()},
        {bank: np.asarray(mask)[positions] for bank, mask in full.activation.items()},
    )
    for column, lse in part.lse.items():
        np.save(folder / f"{column}.npy", lse)
    for bank, mask in part.activation.items():
        np.save(folder / f"activation_{bank}.npy", mask)
    augmented = build_faiss_index(augment_documents(vectors, part), faiss_params.full_precision(), "cpu")
    faiss.write_index(augmented, str(folder / store.AUGMENTED_FAISS))


def global_bm25(
    postings: Postings, vocabulary: dict[str, int], analyzer: Analyzer, params: BM25Params, df: dict[str, int], stats: dict[str, float]
) -> BM25Index:
    """BM25 (Lucene variant) over `postings` whose scores use the whole corpus's statistics: `df` (term -> document
    frequency), stats["documents"] and stats["avgdl"]. The score matrix's entries are the postings' (same order):
        idf(t) * tf / (tf + k1 * (1 - b + b * |d| / avgdl)),   idf(t) = ln(1 + (N - df + 0.5) / (df + 0.5))."""
    bm25 = BM25Index.from_postings(postings, vocabulary, analyzer, params)
    terms = sorted(vocabulary, key=vocabulary.__getitem__)
    n, avgdl = stats["documents"], stats["avgdl"]
    term_df = np.array([df.get(t, 0) for t in terms], dtype=np.float64)  # "" (bm25s's) has no entries
    idf = np.log(1.0 + (n - term_df + 0.5) / (term_df + 0.5))
    tf = postings.tfs.astype(np.float64)
    lengths = postings.lengths.astype(np.float64)[postings.docs]
    norm = params.k1 * (1.0 - params.b + params.b * lengths / avgdl)
    bm25.engine.scores["data"] = (np.repeat(idf, np.diff(postings.indptr)) * tf / (tf + norm)).astype(np.float32)
    return bm25
