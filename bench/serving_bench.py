"""Concurrent serving on loopback, configurations side by side: each configuration's `hybrid serve` runs at once (an
idle server costs nothing), and each client count is measured on every configuration before the next count, so machine
noise hits them alike. Next to it, the compute floor: what the model alone would allow on these cores.

With `--baseline REF`, the service at that git ref runs beside them (a worktree served from the same environment
through PYTHONPATH): it must be able to open the index the current code built.
"""

from __future__ import annotations

import json
import os
import statistics
from contextlib import ExitStack
from pathlib import Path

from bench.compute_floor import graph_flops, peak, texts_floor
from bench.harness import Case, Table, interleaved, verdict
from bench.loadgen import closed_loop
from hybrid_retrieval.evaluation.server import running_server
from hybrid_retrieval.indexer.corpus import split_queries
from hybrid_retrieval.indexer.store import MODEL_DIR
from hybrid_retrieval.models.embedder import OnnxEmbedder
from hybrid_retrieval.models.onnx_export import model_file

# name -> the service's environment on top of the defaults; "default" is what `hybrid serve` does unconfigured
CONFIGURATIONS = {
    "default": {},
    "fp32 queries": {"HYBRID_QUERY_PRECISION": "fp32"},
    # one core per search even when it runs alone: no multi-threaded run ever overlaps the single-threaded ones under load
    "fp32 queries, one thread per search": {"HYBRID_QUERY_PRECISION": "fp32", "HYBRID_INFERENCE_THREADS": "1"},
    "h11 + asyncio": {"HYBRID_HTTP": "h11", "HYBRID_LOOP": "asyncio"},
    "all cores per search, 40 threads": {"HYBRID_INFERENCE_THREADS": str(len(os.sched_getaffinity(0))), "HYBRID_SEARCH_THREADS": "40"},
}


def model_floor(index_dir: Path, texts: list[str], peaks: dict) -> dict:
    """Query embedding on one core (as each concurrent search runs it), fp32 and int8, against the floor."""
    folder = Path(index_dir) / MODEL_DIR
    flops = graph_flops(model_file(folder, "fp32"))
    embedders = {p: OnnxEmbedder(folder, device="cpu", threads=1, precision=p) for p in ("fp32", "int8")}
    times = interleaved({p: (lambda q, e=e: e.encode([q])) for p, e in embedders.items()}, texts)
    return {p: texts_floor(flops, e, texts, peak(peaks, p, 1), 1, measured_ms=statistics.median(times[p])) for p, e in embedders.items()}


def baseline_server(folder: Path) -> dict:
    """How to start the service of another checkout: its package through PYTHONPATH (the layout before the
    `hybrid_retrieval` namespace had the packages at the root)."""
    if (folder / "src" / "hybrid_retrieval").is_dir():
        return {"env": {"PYTHONPATH": str(folder / "src")}, "module": "hybrid_retrieval.app", "cwd": folder}
    return {"env": {"PYTHONPATH": str(folder)}, "module": "app", "cwd": folder}


def run(
    index_dir: Path,
    dataset: Path,
    peaks: dict,
    split: str = "test",
    clients=(1, 4, 16, 64),
    seconds: float = 10.0,
    baseline: Path | None = None,
) -> dict:
    queries, _ = split_queries(dataset, split)
    texts = list(queries.values())
    bodies = [json.dumps({"query": q, "k": 10}).encode() for q in texts]
    servers = {name: {"env": env} for name, env in CONFIGURATIONS.items()}
    if baseline is not None:
        servers = {"baseline": baseline_server(baseline), **servers}
    results: dict[str, dict] = {name: {} for name in servers}
    with ExitStack() as stack:
        urls = {
            name: stack.enter_context(
                running_server(
                    index_dir, {"HYBRID_VERIFY": "size", **how["env"]}, cwd=how.get("cwd"), module=how.get("module", "hybrid_retrieval.app")
                )
            )[0]
            for name, how in servers.items()
        }
        for n in clients:
            for name, url in urls.items():
                closed_loop(url, bodies[:40], n, 2 * n + 20, seconds / 5)  # warm up: sessions, threads, connections
                results[name][n] = closed_loop(url, bodies, n, 1_000_000, seconds)
    floor = model_floor(index_dir, texts, peaks)
    for row in floor.values():  # every core embedding queries and doing nothing else
        row["serving_floor_per_s"] = round(peaks["cores"] * 1000 / row["floor_ms"], 1)
        row["model_only_per_s"] = round(peaks["cores"] * 1000 / row["measured_ms"], 1)
    return {
        "split": split,
        "queries": len(texts),
        "seconds": seconds,
        "clients": list(clients),
        "peaks": peaks,
        "results": results,
        "query_model": floor,
    }


def _serving(ctx) -> list[Table]:
    clients = (1, 4, 16, 64) if not ctx.quick else (1, 4)
    r = run(ctx.index, ctx.data, ctx.peaks, clients=clients, seconds=ctx.size(10, 1), baseline=ctx.baseline if ctx.baseline_ref else None)
    reference = "baseline" if "baseline" in r["results"] else "default"
    rows = []
    for name, by_clients in r["results"].items():
        for n, cell in by_clients.items():
            ratio = cell["throughput_rps"] / r["results"][reference][n]["throughput_rps"]
            rows.append(
                {
                    "configuration": name,
                    "clients": n,
                    "req/s": cell["throughput_rps"],
                    "p50 ms": cell["p50_ms"],
                    "p99 ms": cell["p99_ms"],
                    "errors": cell["errors"],
                    f"req/s ratio to {reference}": round(ratio, 3),
                    "verdict": verdict(ratio),
                }
            )
    settings = [
        {"configuration": name, "settings": ", ".join(f"{k}={v}" for k, v in env.items()) or "none (the defaults)"}
        for name, env in CONFIGURATIONS.items()
    ]
    model = [
        {
            "query embedding, one core": p,
            "p50 ms": row["measured_ms"],
            "floor ms": row["floor_ms"],
            "fraction of peak": row["fraction"],
            "model alone on every core, req/s": row["model_only_per_s"],
            "floor req/s": row["serving_floor_per_s"],
        }
        for p, row in r["query_model"].items()
    ]
    return [
        Table(f"POST /search, k=10, closed loop, {r['seconds']:.0f} s a cell after a warm-up", rows),
        Table("configurations", settings),
        Table("the query model alone against the compute floor", model),
    ]


CASES = [
    Case(
        "Serving",
        "Concurrent serving",
        "`hybrid serve` on 127.0.0.1 in several configurations side by side (all "
        "servers up, each client count measured on every configuration before the next), one index",
        _serving,
    )
]
