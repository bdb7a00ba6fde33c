"""`hybrid repair`: salvage a collection's write-ahead log when a record in it cannot be applied (ReplayError)."""

from __future__ import annotations

from pathlib import Path

from hybrid_retrieval.indexer.live.collection import Collection
from hybrid_retrieval.indexer.store import open_index
from hybrid_retrieval.indexer.wal import Salvage, salvage


def repair_log(path: Path | str, dry_run: bool = False) -> Salvage:
    """Salvage the write-ahead log of the index at `path` (indexer.wal.salvage): keep every intact record that applies
    in order on the base, drop the rest, and say what was dropped. Takes the log's lock: stop the service first."""
    collection = Collection(open_index(path, verify="size", device="cpu"), max_batch_docs=2**31, replay=False)
    applied = collection.seq
    return salvage(collection.wal_path, lambda record: collection.apply_logged(record) if record["seq"] > applied else None, dry_run)
