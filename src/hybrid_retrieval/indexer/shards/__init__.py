"""A sharded index: an index's documents split by a stable hash of their id into N shard folders.

Layout:
    shards.json            what was split, how, and each shard's folder, document count and positions checksum
    shard-000/ ...         a complete index folder (indexer.store) holding that shard's documents, plus
        positions.npy      int64: each document's position in the whole index (the corpus order), ascending

Each shard has its own BM25 and FAISS index, but its BM25 scores use the **corpus-wide** statistics (document
count, average length, document frequencies; the Lucene variant, search.postings), so a document scores the same
whatever shard holds it, and a fitted hubness correction keeps each document's biases and activation (they are
per-document quantities of the whole corpus). Positions keep the whole index's numbering, so a merge of the
shards' rankings breaks ties exactly as the unsharded index does (search.sharded).

A shard is made from a built index (`split_index`, `hybrid shard`; `hybrid index --shards N` builds then splits):
nothing is embedded again. The folder is published atomically, like a build.

    layout       shards.json, the shard folders and positions.npy; which shard an id hashes to (shard_of)
    split        split_index: a built index into shard folders, with the corpus-wide BM25 statistics (global_bm25)
    wire         what a coordinator asks of a shard and of its writer (ShardReader, ShardWriter) and their answers
    shard        ShardSearcher: one shard's searches and writes, in the whole index's numbering
    coordinator  ShardedIndex: the coordinator's index over the shards' clients (fan-out and merge: search.sharded)
    writes       ShardedCollection: writes routed to the shard each id hashes to, refreshed together
    open         opening a shard, a sharded folder in one process, or any index folder (open_any)

Serving the shards on Ray Serve is cluster.serve's (only cluster/ imports Ray).
"""
