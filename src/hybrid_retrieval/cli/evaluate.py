"""`hybrid eval` (quality on BEIR splits) and `hybrid bench` (speed, side by side)."""

from __future__ import annotations

import json
from pathlib import Path

from hybrid_retrieval.cli.args import add_device, add_filter, add_query_precision, default
from hybrid_retrieval.cli.index import add_build_flags, build_options
from hybrid_retrieval.evaluation import gpu_bench
from hybrid_retrieval.evaluation.bench_suite import BenchOptions, run_bench
from hybrid_retrieval.evaluation.report import console_table, write_section
from hybrid_retrieval.evaluation.suite import EvalConfig, evaluate_datasets, summary_table


def register(commands) -> None:
    p = commands.add_parser("eval", help="evaluate pipelines on a BEIR dataset split")
    p.add_argument("--data", type=Path, nargs="+", required=True, help="BEIR dataset folder(s) (corpus.jsonl, queries.jsonl, qrels/)")
    p.add_argument("--split", default=default(EvalConfig, "split"))
    p.add_argument("--index", type=Path, help="index folder to use or build (default indexes/<dataset>)")
    p.add_argument("--no-tune", action="store_true", help="do not tune the fusion on the train/dev split of an untuned index")
    p.add_argument("--pipelines", default=",".join(default(EvalConfig, "pipelines")),
                   help="comma-separated search specs in their string form, merged onto the index's defaults: bm25, dense, "
                   "hybrid, rrf:RRF_K, cc:NORM:ALPHA, +qbnorm[:dis], +dbnorm[:dis], +nohub, +depth:N, +rerank[:d=N][:w=W] "
                   "(needs --reranker), and @int8 for the reranker's int8 weights")
    p.add_argument("--all-hubness", action="store_true", help="also dense and hybrid with every hubness variant (needs `hybrid hubness fit`)")
    p.add_argument("--reranker", help="cross-encoder for `+rerank` pipelines (e.g. a `hybrid train-reranker` folder)")
    p.add_argument("--rerank-depth", type=int, default=default(EvalConfig, "rerank_depth"), help="first-stage hits the reranker reorders")
    p.add_argument("--all-fusions", action="store_true", help="also every fusion the tuning record names (rrf 60, tuned rrf, each norm at its tuned alpha)")
    p.add_argument("--baseline-index", type=Path, help="also run each pipeline on this index (e.g. the same corpus "
                   "with the base model) and compare it with a paired randomisation test")
    add_filter(p)
    add_query_precision(p)
    p.add_argument("--out", type=Path)
    add_device(p)
    add_build_flags(p)
    p.set_defaults(run=run_eval)

    p = commands.add_parser("bench", help="measure throughput and latency side by side")
    p.add_argument("index", type=Path)
    p.add_argument("--data", type=Path, required=True, help="BEIR dataset folder supplying the queries")
    p.add_argument("--split", default=default(BenchOptions, "split"))
    p.add_argument("--out", type=Path, help="write the JSON report here")
    p.add_argument("--http-requests", type=int, default=default(BenchOptions, "http_requests"), help="HTTP requests per concurrency level (loopback)")
    p.add_argument("--reranker", help="also time reranking the hybrid top 50: torch vs ONNX fp32 vs ONNX int8")
    p.add_argument("--batching-seconds", type=float, default=default(BenchOptions, "batching_seconds"), help="per load level of the batching trade-off (0: skip)")
    p.add_argument("--faiss-vectors", type=int, default=default(BenchOptions, "faiss_vectors"), help="also FAISS flat/IVF search on N synthetic vectors, CPU vs GPU (0: skip)")
    p.add_argument("--gpu", action="store_true", help="run every GPU row instead (passage embedding, query embedding, FAISS "
                   "GPU vs CPU on --faiss-vectors or 1,000,000 vectors, reranking with --reranker) and write them into --markdown-file")
    p.add_argument("--markdown-file", type=Path, default=Path("docs/BENCHMARKS.md"), help="where --gpu writes its section")
    add_device(p)
    p.set_defaults(run=run_bench_command)


def run_eval(args) -> None:
    config = EvalConfig(split=args.split, pipelines=tuple(args.pipelines.split(",")), all_fusions=args.all_fusions,
                        all_hubness=args.all_hubness, tune=not args.no_tune, progress=not args.quiet,
                        reranker=args.reranker, rerank_depth=args.rerank_depth, filter=args.filter,
                        query_precision=args.query_precision, baseline_index=args.baseline_index)
    reports = evaluate_datasets(args.data, config, args.index, args.out, build_options(args))
    for report in reports:
        print(console_table(report))
    print(summary_table(reports))
    if args.out:
        print(f"reports, charts, TREC runs and cached runs under {args.out}")


def run_bench_command(args) -> None:
    if args.gpu:
        report = gpu_bench.run(args.index, args.data, args.split, args.reranker, args.faiss_vectors or 1_000_000)
        write_section(args.markdown_file, gpu_bench.markdown(report))
        print(json.dumps(report, indent=2))
        if args.out:
            args.out.write_text(json.dumps(report, indent=2))
        print(f"wrote the GPU section of {args.markdown_file}")
        return
    options = BenchOptions(split=args.split, http_requests=args.http_requests, reranker=args.reranker,
                           batching_seconds=args.batching_seconds, faiss_vectors=args.faiss_vectors, device=args.device)
    report = run_bench(args.index, args.data, options)
    print(json.dumps(report, indent=2))
    if args.out:
        args.out.write_text(json.dumps(report, indent=2))
