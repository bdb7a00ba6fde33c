"""The `hybrid` command. One module per command group; each command turns its arguments into the
domain's parameter objects (defaults read from those objects) and calls one function.

Errors: a `HybridError` (or a file that cannot be read) ends the command with exit code 2 and one
line on stderr; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import logging
import sys

from hybrid_retrieval.cli import evaluate, hubness, index, optimize, serve, snapshot, train
from hybrid_retrieval.common.errors import HybridError

logger = logging.getLogger("hybrid")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hybrid", description="Hybrid BM25 + dense retrieval")
    parser.add_argument("--log-level", default="INFO")
    commands = parser.add_subparsers(dest="command", required=True)
    for group in (index, serve, train, optimize, hubness, snapshot, evaluate):
        group.register(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if args.command == "serve":  # the service parses its own flags
        args.options = rest
    elif rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return args.run(args) or 0
    except (HybridError, OSError) as exc:
        logger.debug("command failed", exc_info=True)
        print(f"error: {exc}", file=sys.stderr)
        return 2
