"""Quality of the service as served: start `hybrid serve` on loopback, send a BEIR split's queries to
POST /search with nothing but the query (so every default applies), score the hits.

Usage: python -m hybrid_retrieval.evaluation.served INDEX_DIR --data BEIR/DATASET [--split test] [--env HYBRID_RERANKER=DIR ...]
Prints one JSON object: the metrics, the defaults the service reported, and the evidence they rest on.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from hybrid_retrieval.evaluation.server import running_server
from hybrid_retrieval.indexer.corpus import split_queries
from hybrid_retrieval.quality.metrics import evaluate


def served_quality(
    index_dir: Path, dataset: Path, split: str = "test", env: dict[str, str] | None = None, k: int = 100, request: dict | None = None
) -> dict:
    """Metrics of the split's queries as served; `request`: more fields for every POST /search (e.g. a mode). Also each
    request's round-trip time in `latencies_ms`, in query order."""
    import httpx  # a dev dependency, like every server-starting benchmark

    queries, qrels = split_queries(dataset, split)
    with (
        running_server(index_dir, {"HYBRID_VERIFY": "size", **(env or {})}) as (url, _),
        httpx.Client(base_url=url, timeout=120) as client,
    ):
        ready = client.get("/ready").json()
        run, latencies_ms = {}, []
        for qid, text in queries.items():
            start = time.perf_counter()
            response = client.post("/search", json={**(request or {}), "query": text, "k": k})
            latencies_ms.append(round((time.perf_counter() - start) * 1000, 3))
            response.raise_for_status()
            run[qid] = {hit["id"]: hit["score"] for hit in response.json()["hits"]}
    metrics = {name: round(value, 4) for name, value in evaluate(run, qrels).items()}
    return {
        "split": split,
        "queries": len(queries),
        **metrics,
        "defaults": ready["defaults"],
        "evidence": ready["evidence"],
        "latencies_ms": latencies_ms,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("index", type=Path)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--split", default="test")
    parser.add_argument("--env", action="append", default=[], help="NAME=VALUE for the service, e.g. HYBRID_RERANKER=models_out/x")
    args = parser.parse_args()
    env = dict(item.split("=", 1) for item in args.env)
    print(json.dumps(served_quality(args.index, args.data, args.split, env), indent=2))


if __name__ == "__main__":
    main()
