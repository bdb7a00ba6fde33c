"""Rerankers side by side on a BEIR split: hybrid + rerank quality (each reranker at its tuned weight, fp32 and int8),
the time to rerank a query's hybrid top 50 on all cores (interleaved query by query), and each against the compute
floor (FLOPs of its graph over the real pair token counts; GEMM peaks measured in the same run).

    python -m evaluation.rerank_bench INDEX DATA/scifact NAME=RERANKER_DIR [NAME=DIR ...] [--split test]
        [--latency-queries 30] [--out rerank.json] [--markdown]
"""

from __future__ import annotations

import argparse
import os
import statistics
from pathlib import Path

from evaluation.accel_bench import interleaved_ms
from evaluation.compute_floor import graph_flops, machine_peaks, pairs_floor, peak
from evaluation.report import add_output_flags, emit
from evaluation.runner import run_queries
from indexer.corpus import split_queries
from indexer.store import open_index
from models.cross_encoder import CachingCrossEncoder, load_cross_encoder, rerank_weight
from models.onnx_export import model_file, training_record
from search.rerank import DEFAULT_RERANK_DEPTH
from training.metrics import evaluate

PRECISIONS = ("fp32", "int8")


def run(index_dir: Path, dataset: Path, rerankers: dict[str, Path], split: str = "test", latency_queries: int = 30,
        depth: int = DEFAULT_RERANK_DEPTH) -> dict:
    queries, qrels = split_queries(dataset, split)
    index = open_index(index_dir, verify="size")
    first_stage = index.pipeline()
    hybrid, _ = run_queries(first_stage, index.doc_ids, queries, {})
    report = {"split": split, "queries": len(queries), "depth": depth, "hybrid_ndcg@10": _ndcg(hybrid, qrels),
              "peaks": machine_peaks(), "rerankers": {}}
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
            models[(name, precision)] = model
        entry |= {"max_length": model.max_length, "layers": graph_flops(model_file(model.folder, "fp32")).attention_matmuls // 2}
        report["rerankers"][name] = entry
    texts = list(queries.values())[:latency_queries]
    inputs = [(q, [index.doc_text(int(d)) for d in first_stage.search(q, k=depth).ranking.doc_idx]) for q in texts]
    times = interleaved_ms({key: (lambda x, m=model: m.score(*x)) for key, model in models.items()}, inputs, warmup=1)
    cores = len(os.sched_getaffinity(0))
    for (name, precision), model in models.items():
        report["rerankers"][name].setdefault("latency", {})[precision] = pairs_floor(
            model, inputs, peak(report["peaks"], precision, cores), statistics.median(times[(name, precision)]), cores)
    index.close()
    return report


def _ndcg(run: dict, qrels: dict) -> float:
    return round(evaluate(run, qrels, ("ndcg@10",))["ndcg@10"], 4)


def markdown(report: dict) -> str:
    peaks = report["peaks"]
    cores = peaks["cores"]
    fp32_peak, int8_peak = peaks[f"fp32_gflops_{cores}"], peaks.get(f"int8_gops_{cores}", float("nan"))
    lines = ["## Rerankers (`python -m evaluation.rerank_bench`)", "",
             f"scifact {report['split']} ({report['queries']} queries): the index's hybrid top {report['depth']} reranked, "
             f"each reranker at the weight `hybrid train-reranker` tuned on held-out train queries; first stage alone "
             f"{report['hybrid_ndcg@10']:.4f}. Latency: one query's {report['depth']} pairs on all "
             f"{cores} cores, the models interleaved query by query; floor: the pairs' FLOPs at the GEMM peak "
             f"({fp32_peak:.0f} GFLOP/s fp32, {int8_peak:.0f} GOP/s int8 on {cores} cores).", "",
             "| reranker | layers | precision | nDCG@10 | rerank p50 ms | floor ms | fraction of peak |",
             "|---|---:|---|---:|---:|---:|---:|"]
    for name, entry in report["rerankers"].items():
        for precision in PRECISIONS:
            row = entry["latency"][precision]
            lines.append(f"| {name} | {entry['layers']} | {precision} | {entry['ndcg@10'][precision]:.4f} | "
                         f"{row['measured_ms']:.0f} | {row['floor_ms']:.0f} | {row['fraction']:.0%} |")
    lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("index", type=Path)
    parser.add_argument("dataset", type=Path)
    parser.add_argument("rerankers", nargs="+", help="NAME=DIR: a `hybrid train-reranker` folder")
    parser.add_argument("--split", default="test")
    parser.add_argument("--latency-queries", type=int, default=30)
    add_output_flags(parser)
    args = parser.parse_args()
    rerankers = {name: Path(folder) for name, folder in (item.split("=", 1) for item in args.rerankers)}
    emit(run(args.index, args.dataset, rerankers, args.split, args.latency_queries), markdown, args)


if __name__ == "__main__":
    main()
