"""What a document costs: the measured inputs of docs/SCALING.md's capacity plan.

    python -m evaluation.capacity INDEX [--vectors 100000] [--queries 200] [--markdown]

1. Bytes a document of each part of a built index (from its manifest's file sizes).
2. Each FAISS index kind over --vectors clustered synthetic unit vectors of the index's dimension: bytes a vector,
   build seconds a million vectors, one-query search latency on one thread and recall@10 against flat; with the
   search time per vector scanned, which is what sizes a shard.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from evaluation.accel_bench import clustered_unit_vectors
from evaluation.bench import percentiles
from indexer.manifest import read_manifest
from search.dense import DenseIndex, FaissParams, build_faiss_index

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


def markdown(report: dict) -> str:
    parts, kinds = report["index"], report["faiss"]
    lines = ["## Capacity inputs (`python -m evaluation.capacity`)", "",
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
    lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("index", type=Path)
    parser.add_argument("--vectors", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    parts = index_bytes(args.index)
    report = {"index": parts, "faiss": faiss_rows(parts["dimension"], args.vectors, args.queries)}
    if args.out:
        args.out.write_text(json.dumps(report, indent=2))
    print(markdown(report) if args.markdown else json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
