"""Query embedding measured on a BEIR split: the index's fp32 graph vs its int8 graph for queries (documents stay fp32:
ranking quality, agreement, latency), and what a query-cache hit costs. Latencies are interleaved per query.

Also documents embedded in int8 (the same corpus built with `hybrid index --precision int8`): quality with the default
(int8) queries on both, and the indexing rate of both graphs over the same passages, interleaved.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import numpy as np

from bench.compute_floor import graph_flops, peak, texts_floor
from bench.harness import Case, Table, interleaved
from hybrid_retrieval.evaluation.runner import run_queries
from hybrid_retrieval.indexer.build import EMBED_BATCH
from hybrid_retrieval.indexer.corpus import split_queries
from hybrid_retrieval.indexer.store import MODEL_DIR, open_index
from hybrid_retrieval.models.embedder import OnnxEmbedder
from hybrid_retrieval.models.onnx_export import model_file
from hybrid_retrieval.models.query_cache import CachedEmbedder, QueryCache
from hybrid_retrieval.quality.metrics import evaluate

SPECS = {"dense": {"mode": "dense"}, "hybrid (the index's default)": {}, "hybrid RRF": {"fusion": {"method": "rrf", "rrf_k": 60}}}


def run(index_dir: Path, dataset: Path, peaks: dict, split: str = "test") -> dict:
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
    return {
        "split": split,
        "queries": len(texts),
        "ndcg@10": quality,
        "cosine_fp32_int8": {"min": round(float(cosines.min()), 4), "median": round(float(np.median(cosines)), 4)},
        "embed_p50_ms": p50,
        "floor": _floor(index_dir, peaks, {p: (e, texts, {"measured_ms": p50[p]}) for p, e in embedders.items()}),
    }


def _floor(index_dir: Path, peaks: dict, stages: dict) -> dict:
    """Each precision's stage (embedder, texts, measured) on all cores against the compute floor of its graph."""
    flops = graph_flops(model_file(index_dir / MODEL_DIR, "fp32"))
    return {
        "peaks": peaks,
        **{
            precision: texts_floor(flops, embedder, texts, peak(peaks, precision, peaks["cores"]), peaks["cores"], **measured)
            for precision, (embedder, texts, measured) in stages.items()
        },
    }


DOCUMENT_SPECS = {"dense": {"mode": "dense"}, "hybrid RRF": {"fusion": {"method": "rrf", "rrf_k": 60}}}


def documents(
    fp32_dir: Path, int8_dir: Path, dataset: Path, peaks: dict, split: str = "test", passages: int = 256, rounds: int = 3
) -> dict:
    """Documents embedded in fp32 vs int8 (queries as served by default on CPU, int8, for both): test nDCG@10, and
    passages per second of both graphs on all cores over the same passages, in alternating rounds."""
    queries, qrels = split_queries(dataset, split)
    indexes = {"fp32": open_index(fp32_dir, verify="size", device="cpu"), "int8": open_index(int8_dir, verify="size", device="cpu")}
    quality = {
        name: {
            precision: round(evaluate(run_queries(index.pipeline(), index.doc_ids, queries, spec)[0], qrels, ("ndcg@10",))["ndcg@10"], 4)
            for precision, index in indexes.items()
        }
        for name, spec in DOCUMENT_SPECS.items()
    }
    texts = [indexes["fp32"].doc_text(i) for i in range(passages)]
    rates = {precision: [] for precision in indexes}
    for _ in range(rounds):
        for precision, index in indexes.items():
            start = time.perf_counter()
            index.embedder.encode(texts, batch_size=EMBED_BATCH)
            rates[precision].append(len(texts) / (time.perf_counter() - start))
    per_s = {p: round(statistics.median(r), 1) for p, r in rates.items()}
    return {
        "ndcg@10": quality,
        "passages_per_s": per_s,
        "passages": passages,
        "rounds": rounds,
        "floor": _floor(fp32_dir, peaks, {p: (index.embedder, texts, {"items_per_s": per_s[p]}) for p, index in indexes.items()}),
    }


def _floor_rows(floor: dict) -> list[dict]:
    return [
        {
            "precision": p,
            "measured": row.get("measured_ms", row.get("measured_per_s")),
            "floor": row["floor_ms"] if "measured_ms" in row else row["floor_per_s"],
            "unit": "ms" if "measured_ms" in row else "items/s",
            "fraction of peak": row["fraction"],
        }
        for p, row in floor.items()
        if p != "peaks"
    ]


def _queries(ctx) -> list[Table]:
    r = run(ctx.index, ctx.data, ctx.peaks)
    quality = [
        {"search": name, "fp32 queries nDCG@10": v["fp32"], "int8 queries nDCG@10": v["int8"], "change": round(v["int8"] - v["fp32"], 4)}
        for name, v in r["ndcg@10"].items()
    ]
    ms = r["embed_p50_ms"]
    latency = [{"embedding": name, "p50 ms": value, "ratio to fp32": round(value / ms["fp32"], 3)} for name, value in ms.items()]
    return [
        Table(
            f"queries embedded by the fp32 vs the int8 graph, documents fp32 ({r['queries']} test queries)",
            quality,
            f"cosine between the two embeddings of a query: min {r['cosine_fp32_int8']['min']}, median {r['cosine_fp32_int8']['median']}.",
        ),
        Table("one query's embedding, interleaved; a query-cache hit", latency),
        Table("against the compute floor (all cores)", _floor_rows(r["floor"])),
    ]


def _documents(ctx) -> list[Table]:
    r = documents(ctx.index, ctx.int8_index, ctx.data, ctx.peaks, passages=ctx.size(256, 32), rounds=ctx.size(3, 1))
    quality = [
        {
            "search": name,
            "fp32 documents nDCG@10": v["fp32"],
            "int8 documents nDCG@10": v["int8"],
            "change": round(v["int8"] - v["fp32"], 4),
        }
        for name, v in r["ndcg@10"].items()
    ]
    rate = [
        {"documents": p, "passages/s": v, "ratio to fp32": round(v / r["passages_per_s"]["fp32"], 3)}
        for p, v in r["passages_per_s"].items()
    ]
    return [
        Table("documents embedded in fp32 vs int8 (queries int8, the CPU default)", quality),
        Table(f"indexing rate over {r['passages']} passages, {r['rounds']} alternating rounds", rate),
        Table("against the compute floor (all cores)", _floor_rows(r["floor"])),
    ]


CASES = [
    Case(
        "Models",
        "Query precision and cache",
        "the index's fp32 vs int8 graph for queries: quality, agreement, latency; what a query-cache hit costs",
        _queries,
    ),
    Case("Models", "Document precision", "the same corpus embedded by the fp32 and the int8 graph", _documents),
]
