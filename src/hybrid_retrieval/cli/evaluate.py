"""`hybrid eval`: quality of search pipelines on BEIR splits."""

from __future__ import annotations

from pathlib import Path

from hybrid_retrieval.cli.args import add_device, add_filter, add_query_precision, default
from hybrid_retrieval.cli.index import add_build_flags, build_options
from hybrid_retrieval.evaluation.report import console_table
from hybrid_retrieval.evaluation.suite import EvalConfig, evaluate_datasets, summary_table


def register(commands) -> None:
    p = commands.add_parser("eval", help="evaluate pipelines on a BEIR dataset split")
    p.add_argument("--data", type=Path, nargs="+", required=True, help="BEIR dataset folder(s) (corpus.jsonl, queries.jsonl, qrels/)")
    p.add_argument("--split", default=default(EvalConfig, "split"))
    p.add_argument("--index", type=Path, help="index folder to use or build (default indexes/<dataset>)")
    p.add_argument("--no-tune", action="store_true", help="do not tune the fusion on the train/dev split of an untuned index")
    p.add_argument(
        "--pipelines",
        default=",".join(default(EvalConfig, "pipelines")),
        help="comma-separated search specs in their string form, merged onto the index's defaults: bm25, dense, "
        "hybrid, rrf:RRF_K, cc:NORM:ALPHA, +qbnorm[:dis], +dbnorm[:dis], +nohub, +depth:N, +rerank[:d=N][:w=W] "
        "(needs --reranker), and @int8 for the reranker's int8 weights",
    )
    p.add_argument(
        "--all-hubness", action="store_true", help="also dense and hybrid with every hubness variant (needs `hybrid hubness fit`)"
    )
    p.add_argument("--reranker", help="cross-encoder for `+rerank` pipelines (e.g. a `hybrid train-reranker` folder)")
    p.add_argument("--rerank-depth", type=int, default=default(EvalConfig, "rerank_depth"), help="first-stage hits the reranker reorders")
    p.add_argument(
        "--all-fusions",
        action="store_true",
        help="also every fusion the tuning record names (rrf 60, tuned rrf, each norm at its tuned alpha)",
    )
    p.add_argument(
        "--baseline-index",
        type=Path,
        help="also run each pipeline on this index (e.g. the same corpus "
        "with the base model) and compare it with a paired randomisation test",
    )
    add_filter(p)
    add_query_precision(p)
    p.add_argument("--out", type=Path)
    add_device(p)
    add_build_flags(p)
    p.set_defaults(run=run_eval)


def run_eval(args) -> None:
    config = EvalConfig(
        split=args.split,
        pipelines=tuple(args.pipelines.split(",")),
        all_fusions=args.all_fusions,
        all_hubness=args.all_hubness,
        tune=not args.no_tune,
        progress=not args.quiet,
        reranker=args.reranker,
        rerank_depth=args.rerank_depth,
        filter=args.filter,
        query_precision=args.query_precision,
        baseline_index=args.baseline_index,
    )
    reports = evaluate_datasets(args.data, config, args.index, args.out, build_options(args))
    for report in reports:
        print(console_table(report))
    print(summary_table(reports))
    if args.out:
        print(f"reports, charts, TREC runs and cached runs under {args.out}")
