"""What killed builds and compactions leave beside an index folder: measured, and removed once provably stale."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from pathlib import Path

from hybrid_retrieval.common.publish import in_use, siblings, sweep_temporary

logger = logging.getLogger(__name__)


def folder_bytes(folder: Path) -> int:
    """Bytes of the files under `folder` (those removed meanwhile left out)."""
    total = 0
    for dirpath, _dirnames, filenames in os.walk(folder):
        for name in filenames:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


def temporary_bytes(index: Path | str) -> int:
    """Disk used beside `index` by builds and compactions in progress, or left by killed ones."""
    return sum(folder_bytes(folder) for folder in siblings(Path(index)))


def remove_leftovers(index: Path | str) -> list[tuple[Path, int]]:
    """Remove the hidden siblings of `index` that killed builds or compactions left, and the temporary files of
    atomic writes (a manifest change) killed inside it, each logged: only when `index` exists (a crash between a
    swap's two renames leaves it missing, and the siblings hold the only copies) and only what no process holds.
    (path, bytes) of each removed folder."""
    index = Path(index)
    if not index.is_dir():
        return []
    for path in sweep_temporary(index):
        logger.warning("removed %s, left by an atomic write that was killed", path)
    removed = []
    for folder in siblings(index):
        if not in_use(folder):
            size = folder_bytes(folder)
            shutil.rmtree(folder, ignore_errors=True)
            if not folder.exists():
                logger.warning("removed %s (%d bytes), left by a build or compaction that was killed", folder, size)
                removed.append((folder, size))
    return removed
