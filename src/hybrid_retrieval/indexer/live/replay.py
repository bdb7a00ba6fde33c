"""Records read back from the write-ahead log: each is checked as a write is (a log is a file: it may have been
edited, or written by another version), then applied to the collection's state. A record that cannot be applied
stops the replay (ReplayError): the collection is not opened, and `hybrid repair` drops such records.
"""

from __future__ import annotations

import base64

from hybrid_retrieval.common.errors import HybridError, SpecError
from hybrid_retrieval.indexer.live.apply import LiveState
from hybrid_retrieval.indexer.live.log import log_path
from hybrid_retrieval.indexer.live.validate import check_batch, check_ids, decide_types


class ReplayError(HybridError):
    """A logged record that cannot be applied: the collection is not opened (`hybrid repair` drops such records)."""


def replay_records(state: LiveState, records) -> None:
    """Apply logged records newer than what the base holds (older ones are in it already: a compaction). A record
    that cannot be applied stops the replay with its sequence number (ReplayError), and nothing is served."""
    wal_path = log_path(state.index.path)
    try:
        for record in records:
            if record["seq"] > state.seq:
                why = apply_logged(state, record)
                if why is not None:
                    raise ReplayError(
                        f"{wal_path}: the record with sequence number {record['seq']} cannot be "
                        f"applied ({why}). Run `hybrid repair {state.index.path}` to drop it (it reports "
                        "what it drops)"
                    )
    except (KeyError, TypeError) as exc:  # a record without a sequence number
        raise ReplayError(f"{wal_path}: a record is not a write ({exc!r}); run `hybrid repair {state.index.path}`") from None


def apply_logged(state: LiveState, record: dict) -> str | None:
    """Check a record read from the log as a write is checked, then apply it; why it cannot be applied, or None."""
    try:
        if record.get("op") == "upsert":
            docs = record["documents"]
            checked = check_batch(
                [{k: d[k] for k in ("id", "title", "text", "metadata") if k in d} for d in docs], 2**31, state.field_types
            )
            added = decide_types(checked, state.field_types, state.filterable)
            representation = state.index.representation
            carried = []
            for doc in docs:
                if len(base64.b64decode(doc["vector"], validate=True)) != 4 * state.index.dense.dimension:
                    raise SpecError(("documents", doc["id"], "vector"), f"not {state.index.dense.dimension} float32 values")
                carried.append(representation.check_logged(doc, state.index.dense.dimension))
            record = {
                **record,
                "documents": [
                    {**c, "vector": d["vector"], **({"position": int(d["position"])} if "position" in d else {}), **more}
                    for c, d, more in zip(checked, docs, carried)
                ],
            }
        elif record.get("op") == "delete":
            record, added = {**record, "ids": check_ids(record["ids"])}, {}
        else:
            return f"unknown operation {record.get('op')!r}"
    except (SpecError, KeyError, TypeError, ValueError) as exc:
        return str(exc) or repr(exc)
    state.apply(record, added=added)
    return None
