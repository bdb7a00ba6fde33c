"""Where a collection's write-ahead log lives in its index folder (live/wal.log), and whether this process can write
it. The log's format, durability and salvage are indexer.wal's.
"""

from __future__ import annotations

import os
from pathlib import Path

LIVE_DIR = "live"
WAL_FILE = "wal.log"


def log_path(folder: Path) -> Path:
    """The write-ahead log of the index at `folder`."""
    return folder / LIVE_DIR / WAL_FILE


def unwritable(wal_path: Path, folder: Path) -> str | None:
    """Why this process cannot write the log at `wal_path` of the index at `folder` (None: it can)."""
    folder = wal_path.parent if wal_path.parent.exists() else folder
    if os.statvfs(folder).f_flag & os.ST_RDONLY:
        return f"{folder} is on a read-only filesystem"
    if not os.access(folder, os.W_OK) or (wal_path.exists() and not os.access(wal_path, os.W_OK)):
        return f"{folder} is not writable by this process"
    return None
