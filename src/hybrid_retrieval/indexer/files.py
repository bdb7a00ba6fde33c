"""The names of an index folder's parts.

Layout (all paths relative to the index folder, all listed with size and sha256 in the manifest):
    manifest.json          what was built, how, from what (indexer.manifest)
    docs.jsonl             one stored document per line, in internal index order
    docs.offsets.npy       byte offset of each line (n + 1 entries) for O(1) random access
    bm25/                  bm25s sparse score matrix (memory-mapped .npy) and vocabulary
    embeddings.npy         float32 unit document vectors, (n, dimension), unless dense.faiss holds them whole
    dense.faiss            FAISS inner-product index over those vectors (flat or hnsw: their only copy)
    dense.trained.faiss    an IVF index's training (clusters, codebooks), empty: what a compaction reuses
    model/                 the ONNX query/document embedder the index was built with
    postings/              term frequencies and document lengths (search.postings): BM25 with live statistics
    metadata/              filterable metadata columns (search.filters), when the documents have any
    passages/              a chunked index's passages (indexer.chunking, indexer.representation)
    reranker/              the index's own cross-encoder (ONNX export and training record), written by `hybrid optimize`
    hubness-<time>/        (after `hybrid hubness fit`) biases, activation sets, augmented FAISS index
    live/                  the write-ahead log of the writes since the build (indexer.live)
"""

DOCS = "docs.jsonl"
DOC_OFFSETS = "docs.offsets.npy"
BM25_DIR = "bm25"
EMBEDDINGS = "embeddings.npy"
FAISS_FILE = "dense.faiss"
TRAINED_FAISS = "dense.trained.faiss"
MODEL_DIR = "model"
RERANKER_DIR = "reranker"  # the index's own cross-encoder (ONNX export and training record), written by `hybrid optimize`
