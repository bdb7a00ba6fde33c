"""`hybrid optimize`: the whole tuning recipe on judged queries, each step kept only if it wins on held-out queries."""

from __future__ import annotations

from pathlib import Path

from hybrid_retrieval.cli.args import add_device, add_quiet, default
from hybrid_retrieval.engine.offline import index_folder
from hybrid_retrieval.training.optimize import STEPS, OptimizeOptions, Optimizer
from hybrid_retrieval.training.optimize_report import markdown


def register(commands) -> None:
    p = commands.add_parser(
        "optimize",
        help="fit the fusion, hubness correction, encoder and reranker on judged queries, keep what wins on held-out ones, "
        "and publish the result in one swap",
    )
    p.add_argument("target", help="an index folder, or the name of a collection of the data directory (--data)")
    p.add_argument("--queries", type=Path, required=True, help="queries.jsonl (only the queries judged in --qrels are read)")
    p.add_argument("--qrels", type=Path, required=True, help="qrels TSV of a training or dev split (never test)")
    p.add_argument(
        "--budget", type=float, default=default(OptimizeOptions, "budget_minutes"), help="minutes on this machine; training is sized to fit"
    )
    p.add_argument(
        "--dev-fraction",
        type=float,
        help="share of the judged queries held out to judge each step (default: a fifth, at least 50 or half of a small set, at most 300)",
    )
    p.add_argument("--steps", default=",".join(STEPS), help=f"comma-separated, in this order: {', '.join(STEPS)}")
    p.add_argument("--data", type=Path, help="the data directory of a collection target (default $HYBRID_DATA or ./data)")
    p.add_argument("--dry-run", action="store_true", help="measure and report, publish nothing")
    p.add_argument("--seed", type=int, default=default(OptimizeOptions, "seed"))
    add_device(p, help="training and evaluation device")
    add_quiet(p)
    p.set_defaults(run=run_optimize)


def run_optimize(args) -> None:
    options = OptimizeOptions(
        budget_minutes=args.budget,
        held_out_fraction=args.dev_fraction,
        steps=tuple(s.strip() for s in args.steps.split(",") if s.strip()),
        seed=args.seed,
        device=args.device,
        publish=not args.dry_run,
    )
    optimizer = Optimizer(index_folder(args.target, args.data), args.queries, args.qrels, options, progress=not args.quiet)
    report = optimizer.run(on_step=lambda step: print(f"{step.name}: {step.decision} ({step.why})", flush=True))
    print(markdown(report))
