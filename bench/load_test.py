"""Sustained load on `hybrid serve` over loopback: N concurrent clients for a bounded time.

Usage: python -m bench.load_test INDEX_DIR --queries queries.jsonl [--clients 16] [--seconds 60]
Prints one JSON object (requests, errors, throughput, p50/p95/p99).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench.measure import http_load
from hybrid_retrieval.indexer.corpus import read_queries


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("index", type=Path)
    parser.add_argument("--queries", type=Path, required=True)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--max-requests", type=int, default=100_000)
    args = parser.parse_args()
    queries = list(read_queries(args.queries).values())
    report = http_load(args.index, queries, (args.clients,), args.max_requests, args.seconds)
    print(json.dumps({"clients": args.clients, "seconds": args.seconds, **report[f"{args.clients} clients"]}))


if __name__ == "__main__":
    main()
