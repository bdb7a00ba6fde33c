"""Rerankers side by side on a BEIR split: hybrid + rerank quality (each reranker at its tuned weight, fp32 and int8),
the time to rerank a query's hybrid top 50 on all cores (interleaved query by query), and each against the compute
floor (FLOPs of its graph over the real pair token counts; GEMM peaks measured in the same run).

    python -m bench.rerank_bench INDEX DATA/scifact NAME=RERANKER_DIR [NAME=DIR ...] [--split test]
        [--latency-queries 30] [--out rerank.json] [--markdown]
"""

from __future__ import annotations

import argparse
import os
import statistics
from pathlib import Path

from bench.harness import interleaved
from bench.compute_floor import graph_flops, machine_peaks, pairs_floor, peak
from hybrid_retrieval.evaluation.report import add_output_flags, emit
from hybrid_retrieval.evaluation.runner import run_queries
from hybrid_retrieval.indexer.corpus import split_queries
from hybrid_retrieval.indexer.store import open_index
from hybrid_retrieval.models.cross_encoder import CachingCrossEncoder, OnnxCrossEncoder, load_cross_encoder, rerank_weight
from hybrid_retrieval.models.onnx_export import model_file, training_record
from hybrid_retrieval.search.rerank import DEFAULT_RERANK_DEPTH
from hybrid_retrieval.training.metrics import evaluate

PRECISIONS = ("fp32", "int8")
SIDE_BY_SIDE = "side by side"  # as served on CPU: one single-threaded run per core
ONE_RUN = "one run on all cores"  # one session whose runs use every core (intra-op threads), as before


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
            model, inputs, peak(report["peaks"], precision, cores), statistics.median(times[(name, precision, execution)]), cores)
    index.close()
    return report


def _ndcg(run: dict, qrels: dict) -> float:
    return round(evaluate(run, qrels, ("ndcg@10",))["ndcg@10"], 4)


def markdown(report: dict) -> str:
    peaks = report["peaks"]
    cores = peaks["cores"]
    fp32_peak, int8_peak = peaks[f"fp32_gflops_{cores}"], peaks.get(f"int8_gops_{cores}", float("nan"))
    lines = ["## Rerankers (`python -m bench.rerank_bench`)", "",
             f"scifact {report['split']} ({report['queries']} queries): the index's hybrid top {report['depth']} reranked, "
             f"each reranker at the weight `hybrid train-reranker` tuned on held-out train queries; first stage alone "
             f"{report['hybrid_ndcg@10']:.4f}. Latency: one query's {report['depth']} pairs on all "
             f"{cores} cores, the models interleaved query by query, either {SIDE_BY_SIDE} (as served on CPU: pair "
             f"batches (int8: one pair) on single-threaded runs, one per core) or as {ONE_RUN} (each run's products "
             f"split across the cores); floor: the pairs' FLOPs at the GEMM peak ({fp32_peak:.0f} GFLOP/s fp32, "
             f"{int8_peak:.0f} GOP/s int8 on {cores} cores).", "",
             f"| reranker | layers | precision | nDCG@10 | p50 ms, {SIDE_BY_SIDE} | p50 ms, {ONE_RUN} | floor ms | "
             f"fraction of peak, {SIDE_BY_SIDE} |",
             "|---|---:|---|---:|---:|---:|---:|---:|"]
    for name, entry in report["rerankers"].items():
        for precision in PRECISIONS:
            row, before = entry["latency"][precision][SIDE_BY_SIDE], entry["latency"][precision][ONE_RUN]
            lines.append(f"| {name} | {entry['layers']} | {precision} | {entry['ndcg@10'][precision]:.4f} | "
                         f"{row['measured_ms']:.0f} | {before['measured_ms']:.0f} | {row['floor_ms']:.0f} | {row['fraction']:.0%} |")
    lines += ["", "How each was trained (its training.json): where it started, the interpolation weight chosen on the held-out "
              "train queries and their nDCG@10 there (fp32; the first stage alone, the reranker alone, interpolated), and "
              "training minutes on this CPU.", "",
              "| reranker | started from | weight | held-out: first stage | reranker alone | interpolated | training min |",
              "|---|---|---:|---:|---:|---:|---:|"]
    for name, entry in report["rerankers"].items():
        record = training_record(entry["path"]) or {}
        dev = record.get("interpolation", {}).get("dev", {}).get("ndcg@10", {})
        started = record.get("base_model", {}).get("name", "?")
        started = "its teacher" if started == record.get("options", {}).get("teacher") else started
        lines.append(f"| {name} | {started} | {entry['weight']:g} | {dev.get('first_stage', float('nan')):.4f} | "
                     f"{dev.get('reranker_only', float('nan')):.4f} | {dev.get('interpolated', float('nan')):.4f} | "
                     f"{(entry['training_s'] or float('nan')) / 60:.1f} |")
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
