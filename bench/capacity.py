"""What a document costs: the measured inputs of the capacity plan in docs/scaling.md.

1. Bytes a document of each part of a built index (from its manifest's file sizes).
2. Each FAISS index kind over N clustered synthetic unit vectors of the index's dimension: bytes a vector,
   build seconds a million vectors, one-query search latency on one thread and recall@10 against flat.
3. BM25 query latency over synthetic corpora of growing sizes: what sizes a shard.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from bench.accel_bench import clustered_unit_vectors
from bench.harness import Case, Table, percentiles, rows_from
from hybrid_retrieval.indexer.manifest import read_manifest
from hybrid_retrieval.search.dense import DenseIndex, FaissParams, build_faiss_index

PARTS = {
    "documents (docs.jsonl + offsets)": ("docs",),
    "BM25 score matrix (bm25/)": ("bm25/",),
    "term frequencies for live writes (postings/)": ("postings/",),
    "stored vectors (embeddings.npy)": ("embeddings.npy",),
    "FAISS index (dense.faiss)": ("dense.faiss",),
    "metadata columns (metadata/)": ("metadata/",),
    "ONNX model (model/), per index": ("model/",),
}
KINDS = {
    "flat": FaissParams(kind="flat"),
    "ivf": FaissParams(kind="ivf", nprobe=16),
    "hnsw": FaissParams(kind="hnsw", hnsw_m=32, ef_search=128),
    "ivfpq": FaissParams(kind="ivfpq", nprobe=16, pq_m=48, pq_refine=4),
}


def index_bytes(index_dir: Path) -> dict:
    manifest = read_manifest(index_dir)
    n = manifest.documents
    rows = {}
    for name, prefixes in PARTS.items():
        total = sum(entry["bytes"] for path, entry in manifest.files.items() if path.startswith(prefixes))
        rows[name] = {"bytes": total, "bytes_per_doc": round(total / n, 1) if "per index" not in name else None}
    return {"documents": n, "dimension": manifest.embedder.dimension, "parts": rows}


def faiss_rows(dimension: int, vectors: int, queries: int) -> dict:
    import faiss

    faiss.omp_set_num_threads(1)  # one query at a time on one thread: what one shard replica's core does
    docs, probe = clustered_unit_vectors(vectors, dimension, queries)
    exact = None
    rows = {}
    for kind, params in KINDS.items():
        faiss.omp_set_num_threads(0 if kind != "flat" else 1)
        started = time.perf_counter()
        index = build_faiss_index(docs, params, "cpu")
        build_s = time.perf_counter() - started
        size = len(faiss.serialize_index(index))
        faiss.omp_set_num_threads(1)
        dense = DenseIndex(index, params, "cpu", docs)  # ivfpq rescores its candidates with the stored vectors
        times, found = [], []
        for q in probe:
            started = time.perf_counter()
            found.append(dense.search(q, 10).doc_idx)
            times.append((time.perf_counter() - started) * 1000)
        if exact is None:
            exact = found
        recall = float(np.mean([len(set(f) & set(e)) / 10 for f, e in zip(found, exact)]))
        rows[kind] = {
            "factory": params.factory(vectors),
            "bytes_per_vector": round(size / vectors, 1),
            "build_s_per_million": round(build_s / vectors * 1e6, 1),
            **percentiles(times),
            "recall@10": round(recall, 4),
        }
    faiss.omp_set_num_threads(0)
    return {"vectors": vectors, "queries": queries, "kinds": rows}


def bm25_rows(sizes: list[int], queries: int = 200, doc_terms: int = 100, vocabulary: int = 100_000, seed: int = 0) -> dict:
    """BM25 (bm25s) query latency as the corpus grows: synthetic documents of Zipf-distributed terms (as text is),
    queries of 5 terms drawn the same way; one query at a time."""
    from hybrid_retrieval.search.analyzer import Analyzer
    from hybrid_retrieval.search.bm25 import BM25Index, BM25Params

    rng = np.random.default_rng(seed)
    words = np.array([f"t{i}" for i in range(vocabulary)])
    draw = lambda n: words[np.minimum(rng.zipf(1.2, n), vocabulary) - 1]
    corpus = [list(draw(doc_terms)) for _ in range(max(sizes))]
    probe = [" ".join(draw(5)) for _ in range(queries)]
    analyzer = Analyzer(stopwords="none", stemmer="none")
    rows = {}
    for size in sizes:
        index = BM25Index.build(corpus[:size], analyzer, BM25Params())
        times = []
        for query in probe:
            started = time.perf_counter()
            index.search(query, 100)
            times.append((time.perf_counter() - started) * 1000)
        rows[size] = percentiles(times)
    return {"doc_terms": doc_terms, "vocabulary": vocabulary, "queries": queries, "sizes": rows}


def _capacity(ctx) -> list[Table]:
    parts = index_bytes(ctx.untuned_index)
    kinds = faiss_rows(parts["dimension"], ctx.size(100_000, 5_000), ctx.size(200, 20))
    bm25 = bm25_rows([50_000, 100_000, 200_000] if not ctx.quick else [5_000, 10_000], ctx.size(200, 20))
    part_rows = [
        {"part": name, "bytes a document": row["bytes_per_doc"], "MiB in all": round(row["bytes"] / 2**20, 1)}
        for name, row in parts["parts"].items()
    ]
    kind_rows = rows_from(
        kinds["kinds"],
        "kind",
        {
            "factory": "factory",
            "bytes_per_vector": "bytes a vector",
            "build_s_per_million": "build s a million",
            "p50_ms": "p50 ms",
            "p99_ms": "p99 ms",
            "recall@10": "recall@10 vs flat",
        },
    )
    bm25_rows_ = [
        {
            "documents": int(size),
            "p50 ms": row["p50_ms"],
            "p99 ms": row["p99_ms"],
            "p50 µs per 1,000 documents": round(row["p50_ms"] * 1e6 / int(size), 1),
        }
        for size, row in bm25["sizes"].items()
    ]
    return [
        Table(f"bytes a document ({parts['documents']} documents, dimension {parts['dimension']}, FAISS flat)", part_rows),
        Table(
            f"FAISS kinds over {kinds['vectors']:,} clustered synthetic unit vectors, {kinds['queries']} queries one at "
            "a time on one thread",
            kind_rows,
        ),
        Table(f"BM25 top 100 over synthetic documents of {bm25['doc_terms']} Zipf-distributed terms, 5-term queries", bm25_rows_),
    ]


CASES = [
    Case(
        "Scale-out",
        "Capacity inputs",
        "bytes a document of each part of an index; FAISS kinds and BM25 by corpus size on synthetic data",
        _capacity,
    )
]
