"""The search engine measured in one process (BM25 engines, latency by mode, FAISS kinds, hubness overhead) and over
loopback HTTP."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from bench.harness import Case, Table, percentiles, rows_from, verdict
from bench.loadgen import closed_loop
from hybrid_retrieval.evaluation.server import running_server
from hybrid_retrieval.indexer.corpus import indexed_text
from hybrid_retrieval.indexer.store import OpenIndex
from hybrid_retrieval.search.bm25 import BM25Params, ReferenceBM25
from hybrid_retrieval.search.dense import DenseIndex, FaissParams, build_faiss_index
from hybrid_retrieval.search.fusion import RRF, ConvexCombination, fusion_to_dict
from hybrid_retrieval.search.pipeline import SearchPipeline
from hybrid_retrieval.search.spec import MODES


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
    return {
        "engine_qps": round(ours_qps, 1),
        "rank_bm25_qps": round(ref_qps, 1),
        "ratio": round(ours_qps / ref_qps, 1),
        "queries": len(queries),
        "rounds": rounds,
    }


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
    variants = {
        name: pipeline.resolve({"mode": "dense", "hubness": {"method": method, "dynamic": dynamic}})
        for name, method, dynamic in (
            ("none", "none", False),
            ("qbnorm IS", "qbnorm", False),
            ("qbnorm DIS", "qbnorm", True),
            ("dbnorm IS", "dbnorm", False),
            ("dbnorm DIS", "dbnorm", True),
        )
    }
    leg, search = {name: [] for name in variants}, {name: [] for name in variants}
    for _ in range(rounds):
        for q in queries:
            for name, spec in variants.items():
                timings = pipeline.search(q, k=k, spec=spec).timings_ms
                leg[name].append(timings["total"])
                search[name].append(timings["dense"])
    base_leg, base_search = statistics.median(leg["none"]), statistics.median(search["none"])
    return {
        name: {
            "dense_leg_p50_ms": round(statistics.median(leg[name]), 3),
            "leg_ratio": round(statistics.median(leg[name]) / base_leg, 3),
            "search_p50_ms": round(statistics.median(search[name]), 3),
            "search_ratio": round(statistics.median(search[name]) / base_search, 3),
        }
        for name in variants
    }


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
        results[params.factory(len(vectors))] = {
            "qps": round(qps, 1),
            f"recall@{k}_vs_flat": round(recall, 4),
            "build_s": round(build_s, 3),
        }
    return results


def http_load(
    index_dir, queries: list[str], concurrency_levels=(1, 4, 16), requests_per_level: int = 400, time_limit_s: float = 60.0
) -> dict:
    """End-to-end HTTP latency and throughput against `hybrid serve` on 127.0.0.1 (loopback only).

    Each level sends a bounded number of requests (and stops early at the time limit).
    """
    bodies = [json.dumps({"query": q, "k": 10}).encode() for q in queries]
    with running_server(index_dir, {"HYBRID_VERIFY": "size"}) as (url, _):
        return {f"{n} clients": closed_loop(url, bodies, n, requests_per_level, time_limit_s) for n in concurrency_levels}


def _index_build(ctx) -> list[Table]:
    manifest = ctx.opened.manifest
    build = manifest.build
    stages = [
        {"stage": stage.removesuffix("_s"), "seconds": build[stage]}
        for stage in ("documents_s", "bm25_s", "embeddings_s", "faiss_s", "total_s")
    ]
    summary = {
        "documents": manifest.documents,
        "documents/s": round(manifest.documents / build["total_s"], 1),
        "peak RSS MiB": build.get("peak_rss_mib"),
        "FAISS": manifest.faiss.factory,
        "document embedding": manifest.embedder.document_backend,
    }
    return [Table("stages", stages), Table("build", [summary])]


def _bm25(ctx) -> list[Table]:
    r = bm25_throughput(ctx.opened, ctx.queries(), rounds=ctx.size(3, 1))
    rows = [
        {"engine": "bm25s (ours)", "queries/s": r["engine_qps"], "ratio": r["ratio"]},
        {"engine": "rank-bm25", "queries/s": r["rank_bm25_qps"], "ratio": 1.0},
    ]
    return [Table("queries/s, median of interleaved rounds", rows)]


def _latency_by_mode(ctx) -> list[Table]:
    report = pipeline_latency(ctx.opened, ctx.queries()[: ctx.size(10_000, 30)])
    rows = [
        {
            "pipeline": mode,
            "p50 ms": m["p50_ms"],
            "p95 ms": m["p95_ms"],
            "p99 ms": m["p99_ms"],
            "fusion share": m.get("fusion_share"),
            "stage medians ms": ", ".join(f"{s} {v:.2f}" for s, v in m["stage_p50_ms"].items() if s != "total"),
        }
        for mode, m in report.items()
    ]
    return [
        Table(
            "latency",
            rows,
            "Fusion share: median over queries of (gathering the missing scores + fusing) / "
            "total. `concurrent legs` runs BM25 in a second thread beside query embedding + dense search.",
        )
    ]


def _dense_kinds(ctx) -> list[Table]:
    report = ann_comparison(ctx.opened, ctx.queries()[: ctx.size(10_000, 30)])
    return [
        Table(
            "FAISS index kinds",
            rows_from(report, "FAISS index", {"qps": "queries/s", "recall@10_vs_flat": "recall@10 vs flat", "build_s": "build s"}),
        )
    ]


def _http(ctx) -> list[Table]:
    queries = ctx.queries()
    levels = http_load(ctx.index, queries, requests_per_level=ctx.size(400, 20))
    sustained = http_load(ctx.index, ctx.queries("train") + queries, (16,), 100_000, ctx.size(60, 3))["16 clients"]
    columns = {
        "requests": "requests",
        "errors": "errors",
        "throughput_rps": "req/s",
        "p50_ms": "p50 ms",
        "p95_ms": "p95 ms",
        "p99_ms": "p99 ms",
    }
    return [
        Table("bounded request count per level", rows_from(levels, "clients", columns)),
        Table(f"sustained: 16 clients for {ctx.size(60, 3)} s", rows_from({"16": sustained}, "clients", columns)),
    ]


def _hubness_overhead(ctx) -> list[Table]:
    if ctx.opened.hubness is None:
        raise RuntimeError("the index has no fitted hubness correction")
    report = hubness_overhead(ctx.opened, ctx.queries()[: ctx.size(10_000, 20)], rounds=ctx.size(3, 1))
    rows = [
        {
            "correction": name,
            "dense leg p50 ms": v["dense_leg_p50_ms"],
            "leg ratio": v["leg_ratio"],
            "search p50 ms": v["search_p50_ms"],
            "search ratio": v["search_ratio"],
            "verdict": verdict(v["leg_ratio"], higher_is_better=False),
        }
        for name, v in report.items()
    ]
    return [Table("dense leg (embed + search) with each correction, ratios to none", rows)]


def _hubness_memory(ctx) -> list[Table]:
    sizes = ["--bank", ctx.size(100_000, 2000), "--docs", ctx.size(50_000, 1000), "--gallery", ctx.size(10_000, 500)]
    done = subprocess.run([sys.executable, "-m", "bench.hubness_memory", *map(str, sizes)], capture_output=True, text=True, check=True)
    return [Table("peak memory of a fit, own process", [json.loads(done.stdout)])]


CASES = [
    Case("Index", "Index build", "`hybrid index` on the dataset: seconds per stage, from the index's manifest", _index_build),
    Case(
        "Search engine",
        "BM25 engine vs rank-bm25",
        "bm25s (ours) vs rank-bm25 on the same corpus, analyzer, k1 and b, test queries, depth 100, interleaved rounds in one process",
        _bm25,
    ),
    Case(
        "Search engine",
        "In-process query latency",
        "each mode and fusion on the test queries, k=10, one thread, legs sequential and concurrent",
        _latency_by_mode,
    ),
    Case(
        "Search engine",
        "Dense index types",
        "flat (exact) vs IVF and HNSW built from the same stored vectors, one query at a time",
        _dense_kinds,
    ),
    Case(
        "Serving",
        "HTTP end to end",
        "`hybrid serve` on 127.0.0.1, hybrid k=10, closed loop from one asyncio client process on the same cores",
        _http,
    ),
    Case("Hubness", "Correction overhead", "dense-leg time with each correction vs none, interleaved query by query", _hubness_overhead),
    Case(
        "Hubness",
        "Fitting memory",
        "fitting QB-Norm and DBNorm on random unit vectors of dimension 384 in a child process: its peak resident memory",
        _hubness_memory,
    ),
]
