"""Fencing: a collection writes only into the folder it loaded. Another process may publish a folder at the same
path (a snapshot restore, a reembed, a rebuild in place); a write logged there would be numbered and applied against
other documents, so the writer checks the folder's identity under its lock and closes for good when it changed.
"""

from __future__ import annotations

from hybrid_retrieval.common.errors import HybridError
from hybrid_retrieval.indexer.store import OpenIndex, folder_identity


class Closed(HybridError):
    """A write or compaction of a collection closed for good (dropped, or replaced by a reload or a restore): nothing
    was logged or published."""


def replaced(index: OpenIndex) -> str | None:
    """Why the folder at the index's path is not the one `index` was loaded from, or None."""
    if index.folder_id is None or folder_identity(index.path) == index.folder_id:
        return None
    return f"{index.path} was replaced by another process (a snapshot restore, a reembed or a rebuild in place)"
