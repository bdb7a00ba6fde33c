"""What a document costs: the measured inputs of docs/SCALING.md's capacity plan.

    python -m bench.capacity INDEX [--vectors 100000] [--queries 200] [--bm25-sizes 50000 100000 200000] [--markdown]

1. Bytes a document of each part of a built index (from its manifest's file sizes).
2. Each FAISS index kind over --vectors clustered synthetic unit vectors of the index's dimension: bytes a vector,
   build seconds a million vectors, one-query search latency on one thread and recall@10 against flat.
3. BM25 query latency over synthetic corpora of --bm25-sizes documents: what sizes a shard.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from bench.accel_bench import clustered_unit_vectors
from bench.harness import percentiles
from hybrid_retrieval.evaluation.report import add_output_flags, emit
from hybrid_retrieval.indexer.manifest import read_manifest
from hybrid_retrieval.search.dense import DenseIndex, FaissParams, build_faiss_index

PARTS = {"documents (docs.jsonl + offsets)": ("docs",), "BM25 score matrix (bm25/)": ("bm25/",),
         "term frequencies for live writes (postings/)": ("postings/",), "stored vectors (embeddings.npy)": ("embeddings.npy",),
         "FAISS index (dense.faiss)": ("dense.faiss",), "metadata columns (metadata/)": ("metadata/",),
         "ONNX model (model/), per index": ("model/",)}
KINDS = {"flat": FaissParams(kind="flat"), "ivf": FaissParams(kind="ivf", nprobe=16),
         "hnsw": FaissParams(kind="hnsw", hnsw_m=32, ef_search=128), "ivfpq": FaissParams(kind="ivfpq", nprobe=16, pq_m=48, pq_refine=4)}


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
        rows[kind] = {"factory": params.factory(vectors), "bytes_per_vector": round(size / vectors, 1),
                      "build_s_per_million": round(build_s / vectors * 1e6, 1), **percentiles(times),
                      "recall@10": round(recall, 4)}
    faiss.omp_set_num_threads(0)
    return {"vectors": vectors, "queries": queries, "kinds": rows}


def bm25_rows(sizes: list[int], queries: int = 200, doc_terms: int = 100, vocabulary: int = 100_000, seed: int = 0) -> dict:
    """BM25 (bm25s) query latency as the corpus grows: synthetic documents of Zipf-distributed terms (as text is),
    queries of 5 terms drawn the same way; one query at a time."""
    from hybrid_retrieval.search.analyzer import Analyzer
    from hybrid_retrieval.search.bm25 import BM25Index, BM25Params

    rng = np.random.default_rng(seed)
    words = np.array([f"t{i}" for i in range(vocabulary)])
    draw = lambda n: words[np.minimum(rng.zipf(1.2, n), vocabulary) - 1]  # noqa: E731
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


def markdown(report: dict) -> str:
    parts, kinds = report["index"], report["faiss"]
    lines = ["## Capacity inputs (`python -m bench.capacity`)", "",
             f"Bytes a document of the scifact index ({parts['documents']} documents, dimension {parts['dimension']}, FAISS flat):", "",
             "| part | bytes a document |", "|---|---:|"]
    for name, row in parts["parts"].items():
        value = f"{row['bytes_per_doc']:.0f}" if row["bytes_per_doc"] is not None else f"{row['bytes'] / 2**20:.0f} MiB in all"
        lines.append(f"| {name} | {value} |")
    lines += ["", f"FAISS kinds over {kinds['vectors']:,} clustered synthetic unit vectors of dimension {parts['dimension']}, "
              f"{kinds['queries']} queries one at a time on one thread (built on every core):", "",
              "| kind | factory | bytes a vector | build s a million | p50 ms | p99 ms | recall@10 vs flat |",
              "|---|---|---:|---:|---:|---:|---:|"]
    for kind, row in kinds["kinds"].items():
        lines.append(f"| {kind} | {row['factory']} | {row['bytes_per_vector']:.0f} | {row['build_s_per_million']:.0f} | "
                     f"{row['p50_ms']:.2f} | {row['p99_ms']:.2f} | {row['recall@10']:.4f} |")
    bm25 = report["bm25"]
    lines += ["", f"BM25 (bm25s, the top 100) over synthetic documents of {bm25['doc_terms']} Zipf-distributed terms "
              f"({bm25['vocabulary']:,}-term vocabulary), 5-term queries one at a time: it scores into an array of every "
              "document, so a query costs time in proportion to the shard's documents.", "",
              "| documents | p50 ms | p99 ms | p50 µs per 1,000 documents |", "|---:|---:|---:|---:|"]
    for size, row in bm25["sizes"].items():
        lines.append(f"| {int(size):,} | {row['p50_ms']:.2f} | {row['p99_ms']:.2f} | {row['p50_ms'] * 1000 / (int(size) / 1000):.1f} |")
    lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("index", type=Path)
    parser.add_argument("--vectors", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--bm25-sizes", type=int, nargs="+", default=[50_000, 100_000, 200_000])
    add_output_flags(parser)
    args = parser.parse_args()
    parts = index_bytes(args.index)
    report = {"index": parts, "faiss": faiss_rows(parts["dimension"], args.vectors, args.queries),
              "bm25": bm25_rows(args.bm25_sizes)}
    emit(report, markdown, args)


if __name__ == "__main__":
    main()
