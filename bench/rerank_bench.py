"""Rerankers side by side on a BEIR split: hybrid + rerank quality (each reranker at its tuned weight, fp32 and int8),
the time to rerank a query's hybrid top 50 on all cores (interleaved query by query), and each against the compute
floor (FLOPs of its graph over the real pair token counts; GEMM peaks measured in the same run).
"""

from __future__ import annotations

import os
import statistics
from pathlib import Path

from bench.compute_floor import graph_flops, pairs_floor, peak
from bench.harness import Case, Table, interleaved
from hybrid_retrieval.evaluation.runner import run_queries
from hybrid_retrieval.indexer.corpus import split_queries
from hybrid_retrieval.indexer.store import open_index
from hybrid_retrieval.models.cross_encoder import CachingCrossEncoder, OnnxCrossEncoder, load_cross_encoder, rerank_weight
from hybrid_retrieval.models.onnx_export import model_file, training_record
from hybrid_retrieval.quality.metrics import evaluate
from hybrid_retrieval.search.rerank import DEFAULT_RERANK_DEPTH

PRECISIONS = ("fp32", "int8")
SIDE_BY_SIDE = "side by side"  # as served on CPU: one single-threaded run per core
ONE_RUN = "one run on all cores"  # one session whose runs use every core (intra-op threads), as before


def run(
    index_dir: Path,
    dataset: Path,
    rerankers: dict[str, Path],
    peaks: dict,
    split: str = "test",
    latency_queries: int = 30,
    depth: int = DEFAULT_RERANK_DEPTH,
) -> dict:
    queries, qrels = split_queries(dataset, split)
    index = open_index(index_dir, verify="size")
    first_stage = index.pipeline()
    hybrid, _ = run_queries(first_stage, index.doc_ids, queries, {})
    report = {
        "split": split,
        "queries": len(queries),
        "depth": depth,
        "hybrid_ndcg@10": _ndcg(hybrid, qrels),
        "peaks": peaks,
        "rerankers": {},
    }
    models = {}
    for name, folder in rerankers.items():
        record = training_record(folder) or {}
        weight = rerank_weight(folder)
        entry = {"path": str(folder), "weight": weight, "training_s": record.get("seconds", {}).get("training"), "ndcg@10": {}}
        for precision in PRECISIONS:
            model = load_cross_encoder(folder, device="cpu", precision=precision)
            pipeline = index.pipeline({"rerank": {"depth": depth, "weight": weight}}, cross_encoder=CachingCrossEncoder(model))
            reranked, _ = run_queries(pipeline, index.doc_ids, queries, {"rerank": {"enabled": True}})
            entry["ndcg@10"][precision] = _ndcg(reranked, qrels)
            models[(name, precision, SIDE_BY_SIDE)] = model
            models[(name, precision, ONE_RUN)] = OnnxCrossEncoder(model.folder, "cpu", precision=precision, workers=1)
        entry |= {"max_length": model.max_length, "layers": graph_flops(model_file(model.folder, "fp32")).attention_matmuls // 2}
        report["rerankers"][name] = entry
    texts = list(queries.values())[:latency_queries]
    inputs = [(q, [index.doc_text(int(d)) for d in first_stage.search(q, k=depth).ranking.doc_idx]) for q in texts]
    times = interleaved({key: (lambda x, m=model: m.score(*x)) for key, model in models.items()}, inputs, warmup=1)
    cores = len(os.sched_getaffinity(0))
    for (name, precision, execution), model in models.items():
        report["rerankers"][name].setdefault("latency", {}).setdefault(precision, {})[execution] = pairs_floor(
            model, inputs, peak(report["peaks"], precision, cores), statistics.median(times[(name, precision, execution)]), cores
        )
    index.close()
    return report


def _ndcg(run: dict, qrels: dict) -> float:
    return round(evaluate(run, qrels, ("ndcg@10",))["ndcg@10"], 4)


def _rerankers(ctx) -> list[Table]:
    rerankers = {
        "6 layers": ctx.reranker,
        "3 layers, distilled": ctx.small_reranker(from_base=False),
        "3 layers, distilled, from the base model": ctx.small_reranker(from_base=True),
    }
    r = run(ctx.index, ctx.data, rerankers, ctx.peaks, latency_queries=ctx.size(30, 3))
    quality = []
    for name, entry in r["rerankers"].items():
        for precision in PRECISIONS:
            side, one = entry["latency"][precision][SIDE_BY_SIDE], entry["latency"][precision][ONE_RUN]
            quality.append(
                {
                    "reranker": name,
                    "layers": entry["layers"],
                    "precision": precision,
                    "nDCG@10": entry["ndcg@10"][precision],
                    "change vs first stage": round(entry["ndcg@10"][precision] - r["hybrid_ndcg@10"], 4),
                    f"p50 ms, {SIDE_BY_SIDE}": side["measured_ms"],
                    f"p50 ms, {ONE_RUN}": one["measured_ms"],
                    "floor ms": side["floor_ms"],
                    "fraction of peak": side["fraction"],
                }
            )
    training = []
    for name, entry in r["rerankers"].items():
        record = training_record(entry["path"]) or {}
        dev = record.get("interpolation", {}).get("dev", {}).get("ndcg@10", {})
        started = record.get("base_model", {}).get("name")
        training.append(
            {
                "reranker": name,
                "started from": "its teacher" if started == record.get("options", {}).get("teacher") else started,
                "weight": entry["weight"],
                "held-out: first stage": dev.get("first_stage"),
                "reranker alone": dev.get("reranker_only"),
                "interpolated": dev.get("interpolated"),
                "training s": entry["training_s"],
            }
        )
    return [
        Table(
            f"the hybrid top {r['depth']} reranked ({r['queries']} test queries; first stage alone {r['hybrid_ndcg@10']})",
            quality,
            f"Latency: one query's pairs on every core, the models interleaved query by query; {SIDE_BY_SIDE}: "
            f"single-threaded runs, one per core, as served on CPU; {ONE_RUN}: each run's products split across "
            "the cores. Floor: the pairs' FLOPs at the machine's GEMM peak.",
        ),
        Table("how each was trained (its training.json; nDCG@10 on the held-out train queries)", training),
    ]


CASES = [
    Case(
        "Models",
        "Rerankers",
        "a 6-layer cross-encoder trained on the train split, and 3-layer ones distilled "
        "from it (started from its layers, or from the base model), each at its tuned weight",
        _rerankers,
    )
]
