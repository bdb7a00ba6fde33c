"""The on-disk layout of a sharded index (its shards.json, shard folders and positions), and which shard an id
hashes to.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from hybrid_retrieval.common.errors import ConfigError
from hybrid_retrieval.indexer import store
from hybrid_retrieval.indexer.manifest import IndexOpenError, read_json

SHARDS_FILE = "shards.json"
SHARDS_FORMAT = "hybrid-retrieval-shards"
SHARDS_FORMAT_VERSION = 1
POSITIONS = "positions.npy"
HASH = "blake2b-64(utf-8 id) mod shards"
MAX_SHARDS = 1024


def shard_of(doc_ids: list[str], shards: int) -> np.ndarray:
    """The shard of each id: a stable hash (the same on every machine and Python run, unlike hash())."""
    return np.fromiter(
        (int.from_bytes(hashlib.blake2b(doc_id.encode(), digest_size=8).digest(), "big") % shards for doc_id in doc_ids),
        dtype=np.int64,
        count=len(doc_ids),
    )


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


def base_positions(index: store.OpenIndex) -> np.ndarray:
    """The position in the whole index of each document of a shard's base segment."""
    positions = np.load(index.path / POSITIONS)
    if len(positions) != index.num_docs:
        raise IndexOpenError(f"{index.path}: {POSITIONS} has {len(positions)} entries for {index.num_docs} documents")
    return positions
