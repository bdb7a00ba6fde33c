"""Query embedding measured on a BEIR split: the index's fp32 graph vs its int8 graph for queries (documents stay fp32:
ranking quality, agreement, latency), and what a query-cache hit costs. Latencies are interleaved per query.

With `--int8-index DIR` (the same corpus built with `hybrid index --precision int8`), also documents embedded in int8:
quality with the default (int8) queries on both, and the indexing rate of both graphs over the same passages,
interleaved.

    python -m bench.query_bench INDEX DATA/scifact [--split test] [--int8-index DIR] [--out query.json] [--markdown]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

from bench.harness import interleaved
from bench.compute_floor import graph_flops, machine_peaks, peak, texts_floor
from hybrid_retrieval.evaluation.runner import run_queries
from hybrid_retrieval.indexer.corpus import split_queries
from hybrid_retrieval.indexer.build import EMBED_BATCH
from hybrid_retrieval.indexer.store import MODEL_DIR, open_index
from hybrid_retrieval.models.embedder import OnnxEmbedder
from hybrid_retrieval.models.onnx_export import model_file
from hybrid_retrieval.models.query_cache import CachedEmbedder, QueryCache
from hybrid_retrieval.training.metrics import evaluate

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
    calls = {**{p: (lambda q, e=e: e.encode([q])) for p, e in embedders.items()}, "cache hit": lambda q: cached.encode([q])}
    times = interleaved(calls, texts, warmup=1)
    p50 = {name: round(statistics.median(v), 3) for name, v in times.items()}
    return {"split": split, "queries": len(texts), "ndcg@10": quality,
            "cosine_fp32_int8": {"min": round(float(cosines.min()), 4), "median": round(float(np.median(cosines)), 4)},
            "embed_p50_ms": p50, "floor": _floor(index_dir, {p: (e, texts, {"measured_ms": p50[p]}) for p, e in embedders.items()})}


def _floor(index_dir: Path, stages: dict) -> dict:
    """Each precision's stage (embedder, texts, measured) on all cores against the compute floor of its graph."""
    peaks = machine_peaks()
    flops = graph_flops(model_file(index_dir / MODEL_DIR, "fp32"))
    return {"peaks": peaks, **{precision: texts_floor(flops, embedder, texts, peak(peaks, precision, peaks["cores"]), peaks["cores"],
                                                      **measured) for precision, (embedder, texts, measured) in stages.items()}}


DOCUMENT_SPECS = {"dense": {"mode": "dense"}, "hybrid RRF": {"fusion": {"method": "rrf", "rrf_k": 60}}}


def documents(fp32_dir: Path, int8_dir: Path, dataset: Path, split: str = "test", passages: int = 256, rounds: int = 3) -> dict:
    """Documents embedded in fp32 vs int8 (queries as served by default on CPU, int8, for both): test nDCG@10, and
    passages per second of both graphs on all cores over the same passages, in alternating rounds."""
    queries, qrels = split_queries(dataset, split)
    indexes = {"fp32": open_index(fp32_dir, verify="size", device="cpu"), "int8": open_index(int8_dir, verify="size", device="cpu")}
    quality = {name: {precision: round(evaluate(run_queries(index.pipeline(), index.doc_ids, queries, spec)[0], qrels,
                                                ("ndcg@10",))["ndcg@10"], 4)
                      for precision, index in indexes.items()} for name, spec in DOCUMENT_SPECS.items()}
    texts = [indexes["fp32"].doc_text(i) for i in range(passages)]
    rates = {precision: [] for precision in indexes}
    for _ in range(rounds):
        for precision, index in indexes.items():
            start = time.perf_counter()
            index.embedder.encode(texts, batch_size=EMBED_BATCH)
            rates[precision].append(len(texts) / (time.perf_counter() - start))
    per_s = {p: round(statistics.median(r), 1) for p, r in rates.items()}
    return {"ndcg@10": quality, "passages_per_s": per_s, "passages": passages, "rounds": rounds,
            "floor": _floor(fp32_dir, {p: (index.embedder, texts, {"items_per_s": per_s[p]}) for p, index in indexes.items()})}


def markdown(report: dict) -> str:
    ms = report["embed_p50_ms"]
    lines = ["## Query precision and cache (`python -m bench.query_bench`)", "",
             f"scifact {report['split']} ({report['queries']} queries), documents embedded in fp32 either way; one query "
             "per call, the three timed one after another for each query.", "",
             "| | fp32 queries | int8 queries | int8 - fp32 |", "|---|---:|---:|---:|"]
    for name, values in report["ndcg@10"].items():
        lines.append(f"| nDCG@10, {name} | {values['fp32']:.4f} | {values['int8']:.4f} | {values['int8'] - values['fp32']:+.4f} |")
    lines.append(f"| embedding p50 | {ms['fp32']:.2f} ms | {ms['int8']:.2f} ms | {ms['int8'] / ms['fp32']:.2f}x |")
    if "floor" in report:
        floor, peaks = report["floor"], report["floor"]["peaks"]
        cores = peaks["cores"]
        fp32_peak, int8_peak = peaks[f"fp32_gflops_{cores}"], peaks.get(f"int8_gops_{cores}", float("nan"))
        lines += [f"| fraction of the compute floor | {floor['fp32']['fraction']:.0%} | {floor['int8']['fraction']:.0%} | |", "",
                  f"Compute floor: each graph's FLOPs over the real token counts at the GEMM peak of all {cores} cores, "
                  f"measured in the same run ({fp32_peak:.0f} GFLOP/s fp32, {int8_peak:.0f} GOP/s int8); a query is too short to fill "
                  "two cores' GEMMs, which is why the service runs one query per core under load (\"Concurrent serving\")."]
    cos = report["cosine_fp32_int8"]
    lines += ["", f"Cosine of the int8 to the fp32 query vectors: min {cos['min']:.4f}, median {cos['median']:.4f}. "
              f"A query-cache hit (`HYBRID_QUERY_CACHE_SIZE`) answers in {ms['cache hit']:.3f} ms p50, "
              f"{ms['fp32'] / ms['cache hit']:.0f}x faster than the fp32 model (tokenizing for its key included).", ""]
    docs = report.get("documents")
    if docs:
        rate = docs["passages_per_s"]
        lines += ["Documents embedded in int8 (`hybrid index --precision int8`; queries in int8 for both, as served on CPU):", "",
                  "| | fp32 documents | int8 documents | int8 - fp32 |", "|---|---:|---:|---:|"]
        for name, values in docs["ndcg@10"].items():
            lines.append(f"| nDCG@10, {name} | {values['fp32']:.4f} | {values['int8']:.4f} | {values['int8'] - values['fp32']:+.4f} |")
        lines += [f"| indexing, passages/s | {rate['fp32']:.1f} | {rate['int8']:.1f} | {rate['int8'] / rate['fp32']:.2f}x |"]
        if "floor" in docs:
            floor = docs["floor"]
            lines.append(f"| fraction of the compute floor | {floor['fp32']['fraction']:.0%} | {floor['int8']['fraction']:.0%} | |")
        lines += ["",
                  f"Indexing rate: the first {docs['passages']} scifact passages embedded by each graph on all cores (fp32 in "
                  f"batches of {EMBED_BATCH}, int8 one passage per run: see models.batching.sequence_batch), median of "
                  f"{docs['rounds']} alternating rounds.", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("index", type=Path)
    parser.add_argument("dataset", type=Path)
    parser.add_argument("--split", default="test")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--int8-index", type=Path, help="the same corpus built with `hybrid index --precision int8`")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    report = run(args.index, args.dataset, args.split)
    if args.int8_index:
        report["documents"] = documents(args.index, args.int8_index, args.dataset, args.split)
    if args.out:
        args.out.write_text(json.dumps(report, indent=2))
    print(markdown(report) if args.markdown else json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
