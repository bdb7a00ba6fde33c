"""Side-by-side measurements on one index, in one process: the numbers docs/BENCHMARKS.md quotes."""

from __future__ import annotations

import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from bench.loadgen import closed_loop
from hybrid_retrieval.evaluation.server import running_server
from hybrid_retrieval.indexer.corpus import indexed_text
from hybrid_retrieval.indexer.store import OpenIndex
from hybrid_retrieval.search.bm25 import BM25Params, ReferenceBM25
from hybrid_retrieval.search.dense import DenseIndex, FaissParams, build_faiss_index
from hybrid_retrieval.search.fusion import RRF, ConvexCombination, fusion_to_dict
from hybrid_retrieval.search.pipeline import SearchPipeline
from hybrid_retrieval.search.spec import MODES


def percentiles(values_ms: list[float]) -> dict[str, float]:
    p50, p95, p99 = np.percentile(values_ms, [50, 95, 99])
    return {"p50_ms": round(float(p50), 3), "p95_ms": round(float(p95), 3), "p99_ms": round(float(p99), 3)}


def _queries_per_second(search, queries: list[str], depth: int) -> float:
    start = time.perf_counter()
    for q in queries:
        search(q, depth)
    return len(queries) / (time.perf_counter() - start)


def bm25_throughput(index: OpenIndex, queries: list[str], depth: int = 100, rounds: int = 3) -> dict:
    """Our BM25 engine vs rank-bm25 on the same corpus, analyzer and k1/b, interleaved rounds."""
    params = index.manifest.bm25
    tokens = (index.analyzer.analyze(indexed_text(doc["title"], doc["text"])) for doc in map(index.docs.get, range(index.num_docs)))
    reference = ReferenceBM25(tokens, index.analyzer, BM25Params(k1=params.k1, b=params.b))
    ours, theirs = [], []
    for _ in range(rounds):  # interleaved so machine noise hits both alike
        ours.append(_queries_per_second(index.bm25.search, queries, depth))
        theirs.append(_queries_per_second(reference.search, queries, depth))
    ours_qps, ref_qps = statistics.median(ours), statistics.median(theirs)
    return {"engine_qps": round(ours_qps, 1), "rank_bm25_qps": round(ref_qps, 1), "ratio": round(ours_qps / ref_qps, 1), "queries": len(queries), "rounds": rounds}


def _latency(pipeline: SearchPipeline, queries: list[str], k: int, spec: dict) -> dict:
    totals, stages = [], {}
    resolved = pipeline.resolve(spec)
    for q in queries:
        result = pipeline.search(q, k=k, spec=resolved)
        totals.append(result.timings_ms["total"])
        for stage, ms in result.timings_ms.items():
            stages.setdefault(stage, []).append(ms)
    report = {**percentiles(totals), "stage_p50_ms": {s: round(statistics.median(v), 3) for s, v in stages.items()}}
    if "fusion" in stages:  # share of the query time spent gathering both scores and fusing
        fusion_ms = np.add(stages["candidates"], stages["fusion"])
        report["fusion_share"] = round(float(np.median(fusion_ms / np.asarray(totals))), 4)
    return report


def hubness_overhead(index: OpenIndex, queries: list[str], k: int = 10, rounds: int = 3) -> dict:
    """Dense-leg time with each correction vs uncorrected, interleaved query by query in one run."""
    pipeline = index.pipeline()
    variants = {name: pipeline.resolve({"mode": "dense", "hubness": {"method": method, "dynamic": dynamic}})
                for name, method, dynamic in (("none", "none", False), ("qbnorm IS", "qbnorm", False), ("qbnorm DIS", "qbnorm", True),
                                              ("dbnorm IS", "dbnorm", False), ("dbnorm DIS", "dbnorm", True))}
    leg, search = {name: [] for name in variants}, {name: [] for name in variants}
    for _ in range(rounds):
        for q in queries:
            for name, spec in variants.items():
                timings = pipeline.search(q, k=k, spec=spec).timings_ms
                leg[name].append(timings["total"])
                search[name].append(timings["dense"])
    base_leg, base_search = statistics.median(leg["none"]), statistics.median(search["none"])
    return {name: {"dense_leg_p50_ms": round(statistics.median(leg[name]), 3),
                   "leg_ratio": round(statistics.median(leg[name]) / base_leg, 3),
                   "search_p50_ms": round(statistics.median(search[name]), 3),
                   "search_ratio": round(statistics.median(search[name]) / base_search, 3)} for name in variants}


def pipeline_latency(index: OpenIndex, queries: list[str], k: int = 10, warmup: int = 10) -> dict:
    """In-process latency of each mode and fusion, legs sequential vs concurrent, same run."""
    sequential = index.pipeline()
    with ThreadPoolExecutor(max_workers=2) as executor:
        concurrent = index.pipeline(executor=executor)
        for q in queries[:warmup]:
            sequential.search(q, k=k)
            concurrent.search(q, k=k)
        report = {mode: _latency(sequential, queries, k, {"mode": mode}) for mode in MODES}
        for name, fusion in (("hybrid rrf", RRF()), ("hybrid cc", ConvexCombination())):
            spec = {"mode": "hybrid", "fusion": fusion_to_dict(fusion)}  # the method's defaults, whatever the index was tuned to
            report[name] = _latency(sequential, queries, k, spec)
            report[f"{name}, concurrent legs"] = _latency(concurrent, queries, k, spec)
    return report


def ann_comparison(index: OpenIndex, queries: list[str], k: int = 10) -> dict:
    """Flat (exact) vs IVF and HNSW built from the same stored vectors: queries/s and recall@k vs flat."""
    vectors = np.asarray(index.embeddings)
    query_vectors = index.query_embedder.encode(queries)
    results, exact = {}, None
    for params in (FaissParams(kind="flat"), FaissParams(kind="ivf"), FaissParams(kind="hnsw")):
        build_start = time.perf_counter()
        dense = DenseIndex(build_faiss_index(vectors, params, "cpu"), params, "cpu")
        build_s = time.perf_counter() - build_start
        start = time.perf_counter()
        found = [dense.search(q, k).doc_idx for q in query_vectors]  # one query at a time, as served
        qps = len(query_vectors) / (time.perf_counter() - start)
        if exact is None:
            exact = found
        recall = float(np.mean([len(set(f.tolist()) & set(e.tolist())) / len(e) for f, e in zip(found, exact) if len(e)]))
        results[params.factory(len(vectors))] = {"qps": round(qps, 1), f"recall@{k}_vs_flat": round(recall, 4), "build_s": round(build_s, 3)}
    return results


def http_load(index_dir, queries: list[str], concurrency_levels=(1, 4, 16), requests_per_level: int = 400,
              time_limit_s: float = 60.0) -> dict:
    """End-to-end HTTP latency and throughput against `hybrid serve` on 127.0.0.1 (loopback only).

    Each level sends a bounded number of requests (and stops early at the time limit).
    """
    bodies = [json.dumps({"query": q, "k": 10}).encode() for q in queries]
    with running_server(index_dir, {"HYBRID_VERIFY": "size"}) as (url, _):
        return {f"{n} clients": closed_loop(url, bodies, n, requests_per_level, time_limit_s) for n in concurrency_levels}
