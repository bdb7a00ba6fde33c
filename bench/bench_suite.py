"""`hybrid bench`: every side-by-side measurement on one index, with the machine it ran on, as one report."""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass
from pathlib import Path

from bench.accel_bench import (
    batching_tradeoff,
    embedding_throughput,
    faiss_cpu_vs_gpu,
    query_embedding_latency,
    rerank_latency,
)
from bench.measure import ann_comparison, bm25_throughput, http_load, hubness_overhead, pipeline_latency
from bench.compute_floor import embedding_floor, machine_peaks
from bench.machine import describe_machine
from hybrid_retrieval.indexer.corpus import split_queries
from hybrid_retrieval.indexer.store import open_index
from hybrid_retrieval.models.onnx_export import training_record


@dataclass(frozen=True)
class BenchOptions:
    split: str = "test"
    http_requests: int = 400  # per concurrency level, over loopback
    reranker: str | None = None  # also time reranking: torch vs ONNX fp32 vs ONNX int8
    batching_seconds: float = 10.0  # per load level of the batching trade-off (0: skip)
    faiss_vectors: int = 0  # also FAISS flat/IVF on N synthetic vectors, CPU vs GPU (0: skip)
    device: str = "auto"


def run_bench(index_dir: Path, dataset: Path, options: BenchOptions = BenchOptions()) -> dict:
    """Every side-by-side measurement of `hybrid bench` on one index, with the machine it ran on."""
    queries, _ = split_queries(dataset, options.split)
    texts = list(queries.values())
    index = open_index(index_dir, verify="size", device=options.device)
    report = {"index": str(index_dir), "documents": index.num_docs, "queries": len(texts), "cpu_count": os.cpu_count(),
              "machine": describe_machine(), "bm25_throughput": bm25_throughput(index, texts),
              "latency": pipeline_latency(index, texts)}
    if index.hubness is not None:
        report["hubness_overhead"] = hubness_overhead(index, texts)
    report["dense_indexes"] = ann_comparison(index, texts)
    report["query_embedding"] = query_embedding_latency(index, texts)
    report["embedding_throughput"] = embedding_throughput(index)
    peaks = machine_peaks()
    report["compute_floor"] = {"peaks": peaks, **embedding_floor(index, texts, report["query_embedding"]["onnx"]["p50_ms"],
                                                                 report["embedding_throughput"]["passages_per_s"], peaks)}
    if options.batching_seconds > 0:
        report["batching"] = batching_tradeoff(index, texts, seconds=options.batching_seconds)
    if options.reranker:
        report["rerank_latency"] = rerank_latency(index, options.reranker, texts, device="cpu", peaks=peaks)
        report["reranker_training"] = training_record(options.reranker)
    if options.faiss_vectors:
        report["faiss_cpu_vs_gpu"] = faiss_cpu_vs_gpu(options.faiss_vectors)
    report["http"] = http_load(index_dir, texts, requests_per_level=options.http_requests)
    build = index.manifest.build
    report["build"] = {"documents_per_s": round(index.num_docs / build["total_s"], 1), "total_s": build["total_s"],
                       "peak_rss_mib": build.get("peak_rss_mib")}
    report["peak_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)  # Linux: KiB
    index.close()
    return report
