"""Opening a sharded index's folder: each shard (with its collection when shards take writes), the whole sharded
index in one process, or whichever index, whole or sharded, a folder holds.
"""

from __future__ import annotations

from pathlib import Path

from hybrid_retrieval.indexer import store
from hybrid_retrieval.indexer.live.collection import Collection
from hybrid_retrieval.indexer.shards.coordinator import ShardedIndex
from hybrid_retrieval.indexer.shards.layout import is_sharded, read_shards
from hybrid_retrieval.indexer.shards.shard import ShardSearcher
from hybrid_retrieval.search.postings import POSTINGS_DIR


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


def open_any(folder: Path | str, verify: str = "full", device: str = "auto", query_precision: str = "auto", embedder=None):
    """The index at `folder`, whole (indexer.store.open_index, with `embedder` when given) or sharded (open_sharded)."""
    if is_sharded(folder):
        return open_sharded(folder, verify, device, query_precision)
    return store.open_index(folder, verify=verify, device=device, query_precision=query_precision, embedder=embedder)
