"""A live collection: the built index (the base segment) plus documents written since, durable and searchable.

Writes (upserts by id, deletes) are validated whole, embedded with the index's own ONNX model, appended to the
write-ahead log (indexer.wal) and fsync'ed before they are acknowledged with a sequence number; then they are
applied to the in-memory state. Searches read an immutable `ReadView` (base + live segment + deletions) that a
refresh builds from that state and swaps in with one reference assignment, so a search never waits for a
write and never sees half of one. On open, the log is replayed: nothing acknowledged is lost.

The log lives in `live/` inside the index folder. BM25 uses the statistics of the documents that exist at the
view (search.segments.LiveBM25), so rankings equal a fresh build's of the same documents.

    collection  Collection: takes writes, publishes them (refresh), follows another writer's log, compacts;
                its locks and where writes are embedded (the thread policy); current_view
    validate    checking a write batch, the ids of a delete, and the metadata types a batch adds
    apply       LiveState: the base and the writes applied on it, in memory; frozen into a ReadView
    replay      records read back from the log, checked and applied (ReplayError)
    view        ReadView: what searches read
    compaction  the steps of a compaction (the corpus written out, the new base built, the log carried over)
    log         where the log lives in the index folder, and whether it can be written
    repair      `hybrid repair`: salvage a log whose records cannot all be applied
"""
