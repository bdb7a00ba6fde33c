"""The engine's door for commands that run while no service does (the CLI): the data directory a command names, what
a search of a folder reads, offline writes and log repair, splitting into shards, and snapshots of a data
directory's collections. The service's door is engine.collections; both keep the same rules on the same folders."""

from __future__ import annotations

import os
from pathlib import Path

from hybrid_retrieval.common.errors import ConfigError, NotFound
from hybrid_retrieval.common.names import check_name
from hybrid_retrieval.common.publish import in_use
from hybrid_retrieval.indexer.datadir.layout import DataDir
from hybrid_retrieval.indexer.datadir.settings import parse_analyzer
from hybrid_retrieval.indexer.datadir.snapshots import (
    SUFFIX,
    SnapshotInfo,
    SnapshotStore,
    model_folders,
    read_info,
    restore_into,
    verify_file,
)
from hybrid_retrieval.indexer.live.collection import DEFAULT_MAX_BATCH_DOCS, Collection, current_view
from hybrid_retrieval.indexer.live.log import LIVE_DIR, log_path
from hybrid_retrieval.indexer.live.repair import repair_log
from hybrid_retrieval.indexer.live.view import ReadView
from hybrid_retrieval.indexer.shards.coordinator import ShardedIndex
from hybrid_retrieval.indexer.shards.layout import check_shard_count
from hybrid_retrieval.indexer.shards.open import open_any
from hybrid_retrieval.indexer.shards.split import split_index
from hybrid_retrieval.indexer.store import OpenIndex, open_index

# what the commands call as the storage modules name it
__all__ = [
    "DEFAULT_MAX_BATCH_DOCS",
    "SUFFIX",
    "check_shard_count",
    "data_dir",
    "index_folder",
    "log_folder",
    "new_collection_folder",
    "parse_analyzer",
    "read_info",
    "repair_log",
    "restore_snapshot",
    "search_view",
    "snapshot_store",
    "split_index",
    "take_snapshot",
    "verify_snapshot",
    "writer",
]


def data_dir(given: str | Path | None) -> DataDir:
    """The data directory a command names: `given`, else $HYBRID_DATA, else ./data (as `hybrid serve` reads it)."""
    return DataDir(given or os.environ.get("HYBRID_DATA") or "data")


def index_folder(target: str, data: Path | None) -> Path:
    """`target` as an index folder: a path to one, or a collection of the data directory."""
    path = Path(target)
    if (path / "manifest.json").is_file():
        return path
    folder = data_dir(data)
    if not folder.exists(target):
        raise NotFound(f"{target!r} is neither an index folder nor a collection of {folder.root}")
    return folder.path(target)


def new_collection_folder(data: DataDir, name: str, replace: bool) -> Path:
    """Where a build of collection `name` goes: its folder in the data directory, free unless `replace` (the
    service's rules: collections and aliases share names)."""
    name = check_name(name, "--collection")
    if data.exists(name) and not replace:
        raise ConfigError(f"collection {name!r} exists in {data.root}: pass --replace to rebuild it (its writes since are dropped)")
    if name in data.aliases:
        raise ConfigError(f"{name!r} is an alias in {data.root}: collections and aliases share names")
    return data.path(name)


def search_view(folder: Path, device: str) -> OpenIndex | ReadView | ShardedIndex:
    """What a search of `folder` reads, as the service would serve it: a sharded index, or a whole one with the writes
    its log holds (read-only: nothing is locked or written)."""
    index = open_any(folder, verify="size", device=device)
    return index if isinstance(index, ShardedIndex) else current_view(index)


def writer(folder: Path, device: str, max_batch_docs: int = DEFAULT_MAX_BATCH_DOCS) -> Collection:
    """The whole index at `folder` opened for writes (`hybrid ingest`): logged as `PUT /documents` logs them, for a
    service to pick up when it next opens the folder. Refused while a service holds its log."""
    return Collection(open_index(folder, verify="size", device=device), max_batch_docs=max_batch_docs)


def log_folder(folder: Path) -> Path:
    """Where an index's write-ahead log lives."""
    return folder / LIVE_DIR


def snapshot_store(data: DataDir, given: str | Path | None = None, keep: int = 0, key: bytes | None = None) -> SnapshotStore:
    """The snapshot folder: `given`, else $HYBRID_SNAPSHOTS, else the data directory's snapshots/ (as the service)."""
    return SnapshotStore(given or os.environ.get("HYBRID_SNAPSHOTS") or data.root / "snapshots", keep, key)


def take_snapshot(data: DataDir, name: str, store: SnapshotStore, include_model: bool) -> SnapshotInfo:
    if not data.exists(name):
        raise NotFound(f"no collection named {name!r} in {data.root}")
    return store.take(data.path(name), name, model="include" if include_model else "reference")


def restore_snapshot(data: DataDir, name: str, source: Path, replace: bool, max_bytes: int, key: bytes | None) -> SnapshotInfo:
    """Restore the snapshot file `source` as collection `name` (a new one, or in place of it when `replace`), checked
    in a staging folder first as the service's restore is; refused while a service writes that collection."""
    if replace and data.exists(name) and in_use(log_path(data.path(name))):
        raise ConfigError(f"a running service writes {name!r}: restore through its API (POST .../snapshots/restore?replace=true)")
    was_foreign = data.has_foreign_model(name)
    data.set_model_origin(name, foreign=True)  # until it is known: a crash mid-restore lends nothing
    try:
        with data.replacing(name, replace) as replacement:
            info = restore_into(source, replacement.folder, max_bytes, key, model_folders(data))
            replacement.publish(replace)
    except BaseException:
        data.set_model_origin(name, foreign=was_foreign)
        raise
    data.set_model_origin(name, foreign=info.model == "included")
    return info


def verify_snapshot(file: Path, max_bytes: int, key: bytes | None, scratch: Path | None, data: DataDir) -> SnapshotInfo:
    """Check a snapshot file as a restore would, restoring nothing."""
    return verify_file(file, max_bytes, key, scratch, model_folders(data))
