"""Scale-out on one machine: index builds embedded by Ray actors vs one process, and what sharding costs a query.

    python -m bench.scale_bench INDEX DATA/scifact [--build-docs 600] [--rounds 2] [--queries 100]
        [--shards 2 4 8] [--out scale.json] [--markdown]

1. Build: the first --build-docs documents built in this process, and with Ray (a local instance: 1 and 2 embedding
   actors), alternating, --rounds each; documents per second of the embedding stage and of the whole build, the
   embedding stage against the compute floor (its FLOPs over the real token counts at this machine's GEMM peak).
2. Coordinator, in process: the index whole and split into each --shards count, the same hybrid searches interleaved
   query by query (every answer checked against the whole index's); p50 per configuration and the coordinator's
   merge of the shards' candidates.
3. Ray Serve: each shard count deployed (one replica a shard) beside `hybrid serve` of the whole index, HTTP searches
   alternating between them query by query on loopback.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.harness import interleaved
from bench.harness import percentiles
from hybrid_retrieval.evaluation.report import add_output_flags, emit
from bench.compute_floor import graph_flops, machine_peaks, peak, texts_floor
from hybrid_retrieval.evaluation.server import free_port, running_server
from hybrid_retrieval.indexer.build import BuildOptions, build_index
from hybrid_retrieval.indexer.corpus import corpus_file, split_queries
from hybrid_retrieval.indexer.shards import open_sharded, split_index
from hybrid_retrieval.indexer.store import MODEL_DIR, open_index
from hybrid_retrieval.models.onnx_export import model_file


def build_rows(corpus: Path, work: Path, docs: int, rounds: int) -> dict:
    """Each configuration's build of the same documents, alternating configurations round by round."""
    import ray

    from hybrid_retrieval.cluster.build import ray_embed

    with corpus_file(corpus).open() as fh:
        (work / "corpus.jsonl").write_text("".join(itertools.islice(fh, docs)))
    started = time.perf_counter()
    ray.init(num_cpus=len(os.sched_getaffinity(0)), include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
    ray_start_s = time.perf_counter() - started
    configs = {"one process": None, "Ray, 1 actor": ray_embed(actors=1), "Ray, 2 actors": ray_embed(actors=2)}
    runs: dict[str, list[dict]] = {name: [] for name in configs}
    try:
        for _ in range(rounds):
            for name, embed in configs.items():
                started = time.perf_counter()
                manifest = build_index(work / "corpus.jsonl", work / "index", BuildOptions(progress=False), embed=embed)
                runs[name].append({"total_s": time.perf_counter() - started, "embeddings_s": manifest.build["embeddings_s"]})
    finally:
        ray.shutdown()
    rows = {name: {"embed_docs_per_s": round(docs / statistics.median(r["embeddings_s"] for r in runs_), 1),
                   "build_docs_per_s": round(docs / statistics.median(r["total_s"] for r in runs_), 1),
                   "embeddings_s": [round(r["embeddings_s"], 2) for r in runs_]}
            for name, runs_ in runs.items()}
    return {"documents": docs, "rounds": rounds, "ray_start_s": round(ray_start_s, 1), "configs": rows}


def embedding_floor_fraction(work: Path, docs_per_s: float, peaks: dict) -> dict:
    index = open_index(work / "index", verify="size")
    texts = [index.doc_text(i) for i in range(min(256, index.num_docs))]
    cores = peaks["cores"]
    return texts_floor(graph_flops(model_file(index.path / MODEL_DIR, "fp32")), index.embedder, texts,
                       peak(peaks, "fp32", cores), cores, items_per_s=docs_per_s)


def coordinator_rows(index_dir: Path, work: Path, queries: list[str], shard_counts: list[int]) -> dict:
    whole = open_index(index_dir, verify="size")
    pipelines, sharded = {"whole": whole.pipeline()}, {}
    for count in shard_counts:
        split_index(index_dir, work / f"shards-{count}", count, verify="size")
        sharded[count] = open_sharded(work / f"shards-{count}", verify="size")
        pipelines[f"{count} shards"] = sharded[count].pipeline()
    merges: dict[str, list[float]] = {name: [] for name in pipelines}
    answers: dict[str, dict[str, list[str]]] = {name: {} for name in pipelines}

    def search(name: str):
        def run(query: str):
            result = pipelines[name].search(query, 10)
            merges[name].append(result.timings_ms.get("candidates", 0.0))
            docs = sharded[int(name.split()[0])].documents(result.ranking.doc_idx) if name != "whole" else None
            answers[name][query] = [d["id"] for d in docs] if docs else [whole.doc_ids[i] for i in result.ranking.doc_idx]
        return run

    times = interleaved({name: search(name) for name in pipelines}, queries)
    rows = {}
    for name in pipelines:
        same = sum(answers[name][q] == answers["whole"][q] for q in queries)
        rows[name] = {**percentiles(times[name]), "merge_p50_ms": round(float(np.median(merges[name][-len(queries):])), 3),
                      "same_answers": same}
    for index in sharded.values():
        index.close()
    return {"queries": len(queries), "rows": rows}


class _Echo:
    def ping(self, payload):
        return payload


def call_rows(calls: int = 200, fan_out: int = 8) -> dict:
    """What one call costs, side by side: a Ray Serve deployment handle vs a plain Ray actor (a query vector as the
    payload), one at a time and `fan_out` at once (a query's calls to its shards)."""
    import ray
    from ray import serve

    handle = serve.run(serve.deployment(_Echo, name="echo").bind(), name="echo", route_prefix=None)
    actor = ray.remote(_Echo).remote()
    payload = np.zeros(384, dtype=np.float32)
    one = {"Serve handle": lambda _: handle.ping.remote(payload).result(), "Ray actor": lambda _: ray.get(actor.ping.remote(payload))}
    many = {"Serve handle": lambda _: [r.result() for r in [handle.ping.remote(payload) for _ in range(fan_out)]],
            "Ray actor": lambda _: ray.get([actor.ping.remote(payload) for _ in range(fan_out)])}
    single, fanned = interleaved(one, list(range(calls)), warmup=20), interleaved(many, list(range(calls // 4)), warmup=5)
    serve.delete("echo")
    ray.kill(actor)
    return {"fan_out": fan_out, "rows": {name: {"one_p50_ms": round(float(np.median(single[name])), 2),
                                                 "fan_out_p50_ms": round(float(np.median(fanned[name])), 2)} for name in one}}


def serve_rows(index_dir: Path, work: Path, queries: list[str], shard_counts: list[int]) -> dict:
    """Ray Serve (one replica a shard) against the whole index served by `hybrid serve`, interleaved query by query."""
    import httpx
    import ray
    from ray import serve

    from hybrid_retrieval.cluster.serve import APP_NAME, serve_index

    ray.init(num_cpus=len(os.sched_getaffinity(0)), include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
    rows = {}
    port = free_port()
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port}, proxy_location="HeadOnly")
        rows["calls"] = call_rows()
        with running_server(index_dir) as (whole_url, _), httpx.Client(timeout=60) as client:
            for count in shard_counts:
                serve_index(work / f"shards-{count}", port=port, verify="size", query_cache_size=0)
                urls = {"hybrid serve, whole": whole_url, f"Ray Serve, {count} shards": f"http://127.0.0.1:{port}"}
                calls = {name: (lambda q, u=url: client.post(f"{u}/search", json={"query": q, "k": 10}).raise_for_status())
                         for name, url in urls.items()}
                times = interleaved(calls, queries)
                rows[count] = {name: percentiles(values) for name, values in times.items()}
                serve.delete(APP_NAME)
    finally:
        serve.shutdown()
        ray.shutdown()
    return rows


def run_all(index_dir: Path, dataset: Path, build_docs: int, rounds: int, n_queries: int, shard_counts: list[int]) -> dict:
    queries = list(split_queries(dataset, "test")[0].values())[:n_queries]
    peaks = machine_peaks()
    with tempfile.TemporaryDirectory(prefix="scale-bench-") as tmp:
        work = Path(tmp)
        build = build_rows(dataset, work, build_docs, rounds)
        for row in build["configs"].values():
            row["embed_floor"] = embedding_floor_fraction(work, row["embed_docs_per_s"], peaks)
        coordinator = coordinator_rows(index_dir, work, queries, shard_counts)
        serving = serve_rows(index_dir, work, queries, shard_counts)
    return {"cores": peaks["cores"], "peaks": peaks, "build": build, "coordinator": coordinator, "serving": serving,
            "documents": open_index(index_dir, verify="size").num_docs}


def markdown(report: dict) -> str:
    build, coord = report["build"], report["coordinator"]
    lines = ["## Scale-out on Ray (`python -m bench.scale_bench`)", "",
             f"{report['cores']} cores, one machine. Build: the first {build['documents']} scifact documents, each "
             f"configuration {build['rounds']} times, alternating (median; a local Ray instance started once in "
             f"{build['ray_start_s']} s, not counted). Fraction of peak: the embedding stage's FLOPs over the real token "
             "counts at this machine's fp32 GEMM peak on every core.", "",
             "| build | embedding docs/s | whole build docs/s | fraction of peak |", "|---|---:|---:|---:|"]
    for name, row in build["configs"].items():
        lines.append(f"| {name} | {row['embed_docs_per_s']} | {row['build_docs_per_s']} | {row['embed_floor']['fraction']:.0%} |")
    rows = coord["rows"]
    whole = rows["whole"]["p50_ms"]
    lines += ["", f"Coordinator in one process: hybrid searches (k=10, the index's default spec) over the "
              f"{report['documents']}-document index whole and split, {coord['queries']} test queries interleaved "
              "query by query; the merge is the coordinator's union of the shards' candidates (search.sharded).", "",
              "| index | p50 ms | p99 ms | vs whole | merge p50 ms | answers equal to the whole index's |",
              "|---|---:|---:|---:|---:|---:|"]
    for name, row in rows.items():
        lines.append(f"| {name} | {row['p50_ms']:.2f} | {row['p99_ms']:.2f} | {row['p50_ms'] / whole:.2f}x | "
                     f"{row['merge_p50_ms']:.3f} | {row['same_answers']} of {coord['queries']} |")
    lines += ["", "Over HTTP on loopback: Ray Serve (one replica a shard, the ingress running the service's app) beside "
              "`hybrid serve` of the whole index, requests alternating query by query:", "",
              "| shards | whole p50 ms | Ray Serve p50 ms | Ray Serve p99 ms | overhead p50 ms |", "|---:|---:|---:|---:|---:|"]
    serving = dict(report["serving"])
    calls = serving.pop("calls")
    for count, row in serving.items():
        whole_row = row["hybrid serve, whole"]
        ray_row = next(v for k, v in row.items() if k.startswith("Ray Serve"))
        lines.append(f"| {count} | {whole_row['p50_ms']:.1f} | {ray_row['p50_ms']:.1f} | {ray_row['p99_ms']:.1f} | "
                     f"{ray_row['p50_ms'] - whole_row['p50_ms']:.1f} |")
    lines += ["", f"Where the Ray Serve overhead goes: one call with a query vector as its payload, a Serve deployment handle "
              f"vs a plain Ray actor, interleaved; one at a time, and {calls['fan_out']} at once (a query's calls to "
              f"{calls['fan_out']} shards):", "", f"| call | one p50 ms | {calls['fan_out']} at once p50 ms |", "|---|---:|---:|"]
    for name, row in calls["rows"].items():
        lines.append(f"| {name} | {row['one_p50_ms']:.2f} | {row['fan_out_p50_ms']:.2f} |")
    lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("index", type=Path)
    parser.add_argument("dataset", type=Path)
    parser.add_argument("--build-docs", type=int, default=600)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--shards", type=int, nargs="+", default=[2, 4, 8])
    add_output_flags(parser)
    args = parser.parse_args()
    report = run_all(args.index, args.dataset, args.build_docs, args.rounds, args.queries, args.shards)
    emit(report, markdown, args)


if __name__ == "__main__":
    main()
