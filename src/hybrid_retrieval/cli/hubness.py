"""`hybrid hubness fit` and `hybrid hubness report`: QB-Norm / DBNorm corrections of dense scores."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

from hybrid_retrieval.cli.args import default
from hybrid_retrieval.evaluation.hubness_eval import write_report
from hybrid_retrieval.indexer.hubness import DEFAULT_GALLERY_SIZE, DEFAULT_PSEUDO_SIZE
from hybrid_retrieval.quality.metrics import format_evidence
from hybrid_retrieval.search.hubness import HubnessParams
from hybrid_retrieval.search.spec import HubnessSpec
from hybrid_retrieval.training.hubness import BETA_PER_SPREAD, fit_hubness_from_bank


def register(commands) -> None:
    p = commands.add_parser("hubness", help="fit or inspect hubness correction (QB-Norm, DBNorm)")
    hubness = p.add_subparsers(dest="hubness_command", required=True)
    p = hubness.add_parser(
        "fit",
        help="fit both corrections from a query bank: requests can then ask for them; "
        "--set-default makes one the index's default, if it does not lose on held-out bank queries",
    )
    p.add_argument("index", type=Path)
    p.add_argument(
        "--bank",
        required=True,
        help="queries.jsonl (with --split-qrels), a text file with one query per line, or 'pseudo' (document titles)",
    )
    p.add_argument("--split-qrels", type=Path, help="qrels of the split whose queries form the bank (never test)")
    p.add_argument("--method", choices=("qbnorm", "dbnorm"), default="qbnorm", help="the method --tune tunes and --set-default sets")
    p.add_argument("--dynamic", action="store_true", help="the dynamic variant (DIS) for --tune and --set-default")
    p.add_argument(
        "--set-default",
        action="store_true",
        help="make --method the index's default, only if its cross-fitted "
        "nDCG@10 on the labelled bank beats no correction (without it the default is none)",
    )
    p.add_argument("--force", action="store_true", help="with --set-default: set it without a win (recorded as forced)")
    for name, scale in BETA_PER_SPREAD.items():
        p.add_argument(
            f"--{name}",
            type=float,
            help=f"default: {scale:g} / the model's score spread (the std of a bank "
            "query's top-100 cosines, median over the bank); with a labelled bank, --method's are then tuned",
        )
    p.add_argument("--k", type=int, default=default(HubnessParams, "k"), help="activation set: each bank member's top-k documents")
    p.add_argument("--gallery-size", type=int, default=DEFAULT_GALLERY_SIZE)
    p.add_argument("--pseudo-size", type=int, default=DEFAULT_PSEUDO_SIZE)
    p.add_argument(
        "--tune",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="choose --method's betas by 5-fold cross-fitting on the bank's labels (default: when the bank is labelled)",
    )
    p.set_defaults(run=run_fit)

    p = hubness.add_parser("report", help="k-occurrence skewness, never-retrieved share and top hubs, before and after")
    p.add_argument("index", type=Path)
    p.add_argument("--queries", type=Path, required=True)
    p.add_argument("--split-qrels", type=Path, help="restrict to the queries of this split")
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--out", type=Path)
    p.set_defaults(run=run_report)


def run_fit(args) -> None:
    betas = {name: getattr(args, name) for name in BETA_PER_SPREAD if getattr(args, name) is not None}
    manifest = fit_hubness_from_bank(
        args.index,
        args.bank,
        HubnessSpec(args.method, args.dynamic),
        betas,
        args.k,
        args.split_qrels,
        args.tune,
        args.set_default,
        args.force,
        args.gallery_size,
        args.pseudo_size,
    )
    fitted = manifest.hubness
    assert fitted is not None and fitted.beta_source is not None  # a fit from a bank records both
    for row in (fitted.tuning or {}).get("table", ()):
        print("  ".join(f"{k}={v:.4g}" for k, v in row.items()))
    print(
        f"fitted qbnorm and dbnorm with {json.dumps(asdict(fitted.params))} ({fitted.beta_source['betas']}; score spread "
        f"{fitted.beta_source['spread']}) on a {fitted.bank['kind']} bank of {fitted.bank['size']} in {fitted.fit_seconds} s; "
        f"activation sets: {fitted.activation}"
    )
    evidence = manifest.evidence.get("hubness", {})
    if args.set_default and "values" in evidence:
        print(format_evidence(evidence))
    if args.set_default:
        print(
            f"default: {manifest.defaults.hubness.method}{' (dynamic)' if manifest.defaults.hubness.dynamic else ''} "
            f"({evidence['decision']})"
        )
    else:
        print(
            'default: none (requests choose a correction with "hubness"; --set-default makes one the default '
            "when it beats none on held-out bank queries)"
        )


def run_report(args) -> None:
    queries, out, rows, default = write_report(args.index, args.queries, args.split_qrels, args.k, args.out)
    print(f"{queries} queries, dense top-{args.k}")
    print(f"{'variant':<14}{'skewness':>10}{'never':>8}{'max N':>7}  top hubs (doc id: N_k)")
    for name, r in rows.items():
        hubs = ", ".join(f"{d}: {n}" for d, n in r["top_hubs"][:3])
        print(f"{name:<14}{r['skewness']:>10.3f}{r['never_retrieved']:>8.1%}{r['max_occurrence']:>7}  {hubs}")
    hubness, evidence = default["hubness"], default["evidence"] or {}
    print(
        f"index default: {hubness['method']}{' (dynamic)' if hubness['dynamic'] else ''}; "
        f"{evidence.get('decision', 'never set by --set-default')}"
        + "".join(f"; {name} {value:.4f}" for name, value in evidence.get("values", {}).items())
        + (f" ({evidence['metric']}, {evidence['queries']} held-out bank queries)" if "values" in evidence else "")
    )
    print(f"histogram and JSON in {out}")
