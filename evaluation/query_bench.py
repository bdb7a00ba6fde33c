"""Query embedding measured on a BEIR split: the index's fp32 graph vs its int8 graph for queries (documents stay fp32:
ranking quality, agreement, latency), and what a query-cache hit costs. Latencies are interleaved per query.

    python -m evaluation.query_bench INDEX DATA/scifact [--split test] [--out query.json] [--markdown]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

from evaluation.runner import run_queries
from indexer.corpus import split_queries
from indexer.store import MODEL_DIR, open_index
from models.embedder import OnnxEmbedder
from models.query_cache import CachedEmbedder, QueryCache
from training.metrics import evaluate

SPECS = {"dense": {"mode": "dense"}, "hybrid (the index's default)": {}, "hybrid RRF": {"fusion": {"method": "rrf", "rrf_k": 60}}}


def run(index_dir: Path, dataset: Path, split: str = "test") -> dict:
    queries, qrels = split_queries(dataset, split)
    index = open_index(index_dir, verify="size", device="cpu")
    embedders = {"fp32": index.embedder, "int8": OnnxEmbedder(index_dir / MODEL_DIR, device="cpu", precision="int8")}
    quality = {name: {} for name in SPECS}
    for precision, embedder in embedders.items():
        pipeline = index.pipeline(embedder=embedder)
        for name, spec in SPECS.items():
            run_, _ = run_queries(pipeline, index.doc_ids, queries, spec)
            quality[name][precision] = round(evaluate(run_, qrels, ("ndcg@10",))["ndcg@10"], 4)
    texts = list(queries.values())
    cosines = (embedders["fp32"].encode(texts) * embedders["int8"].encode(texts)).sum(axis=1)
    cached = CachedEmbedder(index.embedder, QueryCache(len(texts)), "fp32")
    cached.encode(texts)  # every query in the cache: what follows are hits
    calls = {**{p: (lambda e: lambda q: e.encode([q]))(e) for p, e in embedders.items()}, "cache hit": lambda q: cached.encode([q])}
    for call in calls.values():
        call(texts[0])  # warm up
    times = {name: [] for name in calls}
    for text in texts:
        for name, call in calls.items():
            start = time.perf_counter()
            call(text)
            times[name].append((time.perf_counter() - start) * 1000)
    return {"split": split, "queries": len(texts), "ndcg@10": quality,
            "cosine_fp32_int8": {"min": round(float(cosines.min()), 4), "median": round(float(np.median(cosines)), 4)},
            "embed_p50_ms": {name: round(statistics.median(v), 3) for name, v in times.items()}}


def markdown(report: dict) -> str:
    ms = report["embed_p50_ms"]
    lines = ["## Query precision and cache (`python -m evaluation.query_bench`)", "",
             f"scifact {report['split']} ({report['queries']} queries), documents embedded in fp32 either way; one query "
             "per call, the three timed one after another for each query.", "",
             "| | fp32 queries | int8 queries | int8 - fp32 |", "|---|---:|---:|---:|"]
    for name, values in report["ndcg@10"].items():
        lines.append(f"| nDCG@10, {name} | {values['fp32']:.4f} | {values['int8']:.4f} | {values['int8'] - values['fp32']:+.4f} |")
    lines.append(f"| embedding p50 | {ms['fp32']:.2f} ms | {ms['int8']:.2f} ms | {ms['int8'] / ms['fp32']:.2f}x |")
    cos = report["cosine_fp32_int8"]
    lines += ["", f"Cosine of the int8 to the fp32 query vectors: min {cos['min']:.4f}, median {cos['median']:.4f}. "
              f"A query-cache hit (`HYBRID_QUERY_CACHE_SIZE`) answers in {ms['cache hit']:.3f} ms p50, "
              f"{ms['fp32'] / ms['cache hit']:.0f}x faster than the fp32 model (tokenizing for its key included).", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("index", type=Path)
    parser.add_argument("dataset", type=Path)
    parser.add_argument("--split", default="test")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    report = run(args.index, args.dataset, args.split)
    if args.out:
        args.out.write_text(json.dumps(report, indent=2))
    print(markdown(report) if args.markdown else json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
