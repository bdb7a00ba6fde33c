"""Concurrent serving on loopback, configurations side by side: each configuration's `hybrid serve` runs at once (an
idle server costs nothing), and each client count is measured on every configuration before the next count, so machine
noise hits them alike. Next to it, the compute floor: what the model alone would allow on these cores.

    python -m bench.serving_bench INDEX DATA/scifact [--clients 1,4,16,64] [--seconds 10]
        [--baseline PATH] [--out serving.json] [--markdown]

`--baseline PATH` adds the service as it was before this work: a checkout of commit b7fc9f3
(`git worktree add --detach PATH b7fc9f3`), served from the same environment through PYTHONPATH, without httptools
and uvloop (it did not depend on them; uvicorn falls back to h11 and asyncio when their import fails).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from contextlib import ExitStack
from pathlib import Path

from bench.harness import interleaved
from bench.compute_floor import graph_flops, machine_peaks, peak, texts_floor
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
    return {p: texts_floor(flops, e, texts, peak(peaks, p, 1), 1, measured_ms=statistics.median(times[p]))
            for p, e in embedders.items()}


def run(index_dir: Path, dataset: Path, split: str = "test", clients=(1, 4, 16, 64), seconds: float = 10.0,
        baseline: Path | None = None) -> dict:
    queries, _ = split_queries(dataset, split)
    texts = list(queries.values())
    bodies = [json.dumps({"query": q, "k": 10}).encode() for q in texts]
    configurations = dict(CONFIGURATIONS)
    peaks = machine_peaks()
    with ExitStack() as servers:
        if baseline is not None:
            hidden = Path(servers.enter_context(tempfile.TemporaryDirectory()))
            for package in ("httptools", "uvloop"):
                (hidden / package).mkdir()
                (hidden / package / "__init__.py").write_text("raise ImportError('not a dependency before this change')\n")
            configurations = {"before (b7fc9f3)": {"PYTHONPATH": f"{baseline}{os.pathsep}{hidden}"}, **configurations}
        results: dict[str, dict] = {name: {} for name in configurations}
        urls = {name: servers.enter_context(running_server(index_dir, {"HYBRID_VERIFY": "size", **env},
                                                           cwd=baseline if "PYTHONPATH" in env else None))[0]
                for name, env in configurations.items()}
        for n in clients:
            for name, url in urls.items():
                closed_loop(url, bodies[:40], n, 2 * n + 20, seconds / 5)  # warm up: sessions, threads, connections
                results[name][n] = closed_loop(url, bodies, n, 1_000_000, seconds)
    floor = model_floor(index_dir, texts, peaks)
    for precision, row in floor.items():  # every core embedding queries and doing nothing else
        row["serving_floor_per_s"] = round(peaks["cores"] * 1000 / row["floor_ms"], 1)
        row["model_only_per_s"] = round(peaks["cores"] * 1000 / row["measured_ms"], 1)
    return {"split": split, "queries": len(texts), "seconds": seconds, "clients": list(clients), "peaks": peaks,
            "configurations": configurations, "results": results, "query_model": floor}


def markdown(report: dict) -> str:
    results, clients, peaks = report["results"], report["clients"], report["peaks"]
    names = list(results)
    lines = ["## Concurrent serving (`python -m bench.serving_bench`)", "",
             f"`hybrid serve` on 127.0.0.1, POST /search with a scifact {report['split']} query (k=10, every other default), "
             f"closed loop: each client sends its next request when the previous answer arrives, {report['seconds']:.0f} s per "
             "cell after a warm-up, one asyncio client process on the same cores. The configurations ran side by side "
             "(all servers up, each client count measured on every configuration before the next count), all serving one index"
             + (" (built by the before commit's code: it cannot open an index written since, which every later version opens)"
                if "before (b7fc9f3)" in report["results"] else "") + ".", "",
             "| configuration | " + " | ".join(f"{n} clients: req/s, p50 / p99 ms" for n in clients) + " | errors |",
             "|---|" + "---:|" * len(clients) + "---:|"]
    for name in names:
        cells = [f"{results[name][str(n)]['throughput_rps']:.0f}, {results[name][str(n)]['p50_ms']:.1f} / "
                 f"{results[name][str(n)]['p99_ms']:.0f}" for n in clients]
        errors = sum(results[name][str(n)]["errors"] for n in clients)
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {errors} |")
    lines += ["", "Configurations: " + "; ".join(f"{name}: {_env(env)}" for name, env in report["configurations"].items()) + "."]
    if "before (b7fc9f3)" in results:
        before, after = results["before (b7fc9f3)"], results["default"]
        fp32 = results["fp32 queries"]
        ratios = ", ".join(f"{n} clients {after[str(n)]['throughput_rps'] / before[str(n)]['throughput_rps']:.2f}x"
                           for n in clients)
        lines += ["", f"Default vs before, throughput: {ratios}; with fp32 queries as before: "
                  + ", ".join(f"{n} clients {fp32[str(n)]['throughput_rps'] / before[str(n)]['throughput_rps']:.2f}x"
                              for n in clients) + "."]
    model = report["query_model"]
    lines += ["", f"Compute floor (`evaluation.compute_floor`, measured in the same run): GEMM peak {peaks['fp32_gflops_1']:.0f} "
              f"GFLOP/s fp32 and {peaks.get('int8_gops_1', float('nan')):.0f} GOP/s int8 (ONNX Runtime MatMulInteger) on one "
              f"core, {peaks['cores']} cores. A query has {model['fp32']['mean_tokens']:.1f} tokens on average: "
              f"{model['fp32']['gflop']:.3f} GFLOP.", "",
              "| query embedding, one core | p50 ms | floor ms | fraction of peak | model alone on every core, req/s | floor req/s |",
              "|---|---:|---:|---:|---:|---:|"]
    for precision, row in model.items():
        lines.append(f"| {precision} | {row['measured_ms']:.2f} | {row['floor_ms']:.2f} | {row['fraction']:.0%} | "
                     f"{row['model_only_per_s']:.0f} | {row['serving_floor_per_s']:.0f} |")
    best = {name: results[name][str(max(clients))]["throughput_rps"] for name in names}
    default_rps, fp32_rps = results["default"]["16"]["throughput_rps"], results["fp32 queries"]["16"]["throughput_rps"]
    fp32_one = results["fp32 queries, one thread per search"]["16"]
    lines += ["", f"At 16 clients the default serves {default_rps:.0f} req/s, {default_rps / model['int8']['model_only_per_s']:.0%} "
              f"of what the int8 query model alone allows on these cores and {default_rps / model['int8']['serving_floor_per_s']:.0%} "
              f"of the int8 GEMM floor; with fp32 queries {fp32_rps:.0f} req/s, "
              f"{fp32_rps / model['fp32']['model_only_per_s']:.0%} of the fp32 model alone and "
              f"{fp32_rps / model['fp32']['serving_floor_per_s']:.0%} of its floor; with fp32 queries on one thread per search "
              f"{fp32_one['throughput_rps']:.0f} req/s (p99 {fp32_one['p99_ms']:.0f} ms), "
              f"{fp32_one['throughput_rps'] / model['fp32']['model_only_per_s']:.0%} of the fp32 model alone. "
              f"At {max(clients)} clients: " + ", ".join(f"{name} {rps:.0f} req/s" for name, rps in best.items()) + ".", ""]
    return "\n".join(lines)


def _env(env: dict) -> str:
    shown = {k: v for k, v in env.items() if k != "PYTHONPATH"}
    source = "the previous commit's code, h11 and asyncio" if "PYTHONPATH" in env else ""
    settings = ", ".join(f"`{k}={v}`" for k, v in shown.items())
    return ", ".join(filter(None, (source, settings))) or "no setting"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("index", type=Path)
    parser.add_argument("dataset", type=Path)
    parser.add_argument("--split", default="test")
    parser.add_argument("--clients", default="1,4,16,64")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--baseline", type=Path, help="a checkout of the code before (commit b7fc9f3)")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    report = run(args.index, args.dataset, args.split, tuple(int(n) for n in args.clients.split(",")), args.seconds, args.baseline)
    report = json.loads(json.dumps(report))  # client counts as strings, as read back from --out
    if args.out:
        args.out.write_text(json.dumps(report, indent=2))
    print(markdown(report) if args.markdown else json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
