"""Run the benchmarks and render docs/BENCHMARKS.md and the README's headline from the record.

    python -m bench run [--only SECTION_OR_CASE ...] [--skip ...] [--quick] [--baseline REF] [--out RECORD.json]
    python -m bench render RECORD.json [--update] [--benchmarks docs/BENCHMARKS.md] [--readme README.md]
    python -m bench prepare   (make the indexes and models the cases measure, once: hours on a small CPU)
    python -m bench list

`bash scripts/benchmarks.sh` does both on this machine in one run. After a change that moves a few cases' figures,
`run --only CASE ...` and `render RECORD.json --update` re-measure those cases alone and replace them in the document.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from bench.catalog import CASES, select
from bench.context import Context
from bench.harness import run_cases, stamp, write_record
from bench.render import has_headline, render_benchmarks, update_benchmarks, write_headline


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run cases and write their record")
    prepare = commands.add_parser("prepare", help="make every index and model the cases use (reused while present)")
    for command in (run, prepare):
        command.add_argument(
            "--data",
            type=Path,
            default=Path(os.environ.get("BEIR_DATA", "../shared/data/beir")) / "scifact",
            help="BEIR dataset folder (default $BEIR_DATA/scifact)",
        )
        command.add_argument("--work", type=Path, default=Path("runs/bench"), help="indexes and models made for the cases, reused")
    run.add_argument("--only", nargs="+", help="sections or case names to run (default: all)")
    run.add_argument("--skip", nargs="+", help="sections or case names not to run")
    run.add_argument("--quick", action="store_true", help="smoke-sized cases (seconds, not the published figures)")
    run.add_argument("--baseline", metavar="REF", help="a git ref whose service also runs in the serving case")
    run.add_argument("--out", type=Path, default=Path("runs/bench/record.json"))
    run.add_argument(
        "--resume",
        action="store_true",
        help="continue the interrupted run recorded in --out (made by this same commit): its cases that ran are kept",
    )
    render = commands.add_parser("render", help="write docs/BENCHMARKS.md (and the README's headline) from a record")
    render.add_argument("record", type=Path)
    render.add_argument("--benchmarks", type=Path, default=Path("docs/BENCHMARKS.md"))
    render.add_argument("--readme", type=Path, default=Path("README.md"), help="where the headline block goes")
    render.add_argument(
        "--update",
        action="store_true",
        help="replace only the record's cases in the existing document (and the headline if the record has it)",
    )
    sizing = commands.add_parser("sizing", help="write docs/sizing.md from records of the million-document cases")
    sizing.add_argument("records", type=Path, nargs="+")
    sizing.add_argument("--out", type=Path, default=Path("docs/sizing.md"))
    commands.add_parser("list", help="list the cases")
    args = parser.parse_args(argv)
    if args.command == "list":
        for case in CASES:
            print(f"{case.section} / {case.name}{' (needs ' + ', '.join(case.needs) + ')' if case.needs else ''}: {case.measures}")
    elif args.command == "sizing":
        from bench.sizing import render_sizing

        args.out.write_text(render_sizing([json.loads(path.read_text()) for path in args.records]))
        print(f"[bench] wrote {args.out}")
    elif args.command == "prepare":
        Context(args.data, args.work).prepare()
    elif args.command == "run":
        cases = select(args.only, args.skip)
        resumed = _resumable(args.out) if args.resume and args.out.is_file() else None
        context = Context(args.data, args.work, quick=args.quick, baseline=args.baseline)
        record = run_cases(cases, context, resumed=resumed, save=lambda record: write_record(record, args.out))
        write_record(record, args.out)
        print(f"[bench] record: {args.out}")
    else:
        record = json.loads(args.record.read_text())
        if record["context"].get("quick"):
            raise SystemExit(f"{args.record} is a quick run's: its smoke-sized figures do not go into {args.benchmarks}")
        if args.update:
            order = [(case.section, case.name) for case in CASES]
            args.benchmarks.write_text(update_benchmarks(args.benchmarks.read_text(), record, order))
        else:
            args.benchmarks.write_text(render_benchmarks(record))
        headline = has_headline(record)
        if headline:
            write_headline(args.readme, record)
        print(f"[bench] wrote {args.benchmarks}" + (f" and the headline of {args.readme}" if headline else ""))


def _resumable(path: Path) -> dict:
    """The record of an interrupted run, if this clean checkout is the commit that made it (else SystemExit)."""
    record = json.loads(path.read_text())
    now, then = stamp(), record["stamp"]
    if now["dirty"] or then["dirty"] or now["commit"] != then["commit"]:
        raise SystemExit(
            f"{path} was made by commit {then['commit']}{' (dirty)' if then['dirty'] else ''}, this checkout is "
            f"{now['commit']}{' (dirty)' if now['dirty'] else ''}: resume from a clean checkout of that commit, or start over"
        )
    return record


if __name__ == "__main__":
    main()
