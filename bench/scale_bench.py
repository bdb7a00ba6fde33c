"""Scale-out on one machine: index builds embedded by Ray actors vs one process, and what sharding costs a query.

1. Build: the first N documents built in this process, and with Ray (a local instance: 1 and 2 embedding
   actors), alternating rounds; documents per second of the embedding stage and of the whole build, the
   embedding stage against the compute floor (its FLOPs over the real token counts at this machine's GEMM peak).
2. Coordinator, in process: the index whole and split into each shard count, the same hybrid searches interleaved
   query by query (every answer checked against the whole index's); p50 per configuration and the coordinator's
   merge of the shards' candidates.
3. Ray Serve: each shard count deployed (one replica a shard) beside `hybrid serve` of the whole index, HTTP searches
   alternating between them query by query on loopback.
"""

from __future__ import annotations

import itertools
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.compute_floor import graph_flops, peak, texts_floor
from bench.harness import Case, Table, interleaved, percentiles, rows_from
from hybrid_retrieval.evaluation.server import free_port, running_server
from hybrid_retrieval.indexer.build import BuildOptions, build_index
from hybrid_retrieval.indexer.corpus import corpus_file
from hybrid_retrieval.indexer.shards.open import open_sharded
from hybrid_retrieval.indexer.shards.split import split_index
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
    rows = {
        name: {
            "embed_docs_per_s": round(docs / statistics.median(r["embeddings_s"] for r in runs_), 1),
            "build_docs_per_s": round(docs / statistics.median(r["total_s"] for r in runs_), 1),
            "embeddings_s": [round(r["embeddings_s"], 2) for r in runs_],
        }
        for name, runs_ in runs.items()
    }
    return {"documents": docs, "rounds": rounds, "ray_start_s": round(ray_start_s, 1), "configs": rows}


def embedding_floor_fraction(work: Path, docs_per_s: float, peaks: dict) -> dict:
    index = open_index(work / "index", verify="size")
    texts = [index.doc_text(i) for i in range(min(256, index.num_docs))]
    cores = peaks["cores"]
    return texts_floor(
        graph_flops(model_file(index.path / MODEL_DIR, "fp32")),
        index.embedder,
        texts,
        peak(peaks, "fp32", cores),
        cores,
        items_per_s=docs_per_s,
    )


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
        rows[name] = {
            **percentiles(times[name]),
            "merge_p50_ms": round(float(np.median(merges[name][-len(queries) :])), 3),
            "same_answers": same,
        }
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
    many = {
        "Serve handle": lambda _: [r.result() for r in [handle.ping.remote(payload) for _ in range(fan_out)]],
        "Ray actor": lambda _: ray.get([actor.ping.remote(payload) for _ in range(fan_out)]),
    }
    single, fanned = interleaved(one, list(range(calls)), warmup=20), interleaved(many, list(range(calls // 4)), warmup=5)
    serve.delete("echo")
    ray.kill(actor)
    return {
        "fan_out": fan_out,
        "rows": {
            name: {"one_p50_ms": round(float(np.median(single[name])), 2), "fan_out_p50_ms": round(float(np.median(fanned[name])), 2)}
            for name in one
        },
    }


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
                calls = {
                    name: (lambda q, u=url: client.post(f"{u}/search", json={"query": q, "k": 10}).raise_for_status())
                    for name, url in urls.items()
                }
                times = interleaved(calls, queries)
                rows[count] = {name: percentiles(values) for name, values in times.items()}
                serve.delete(APP_NAME)
    finally:
        serve.shutdown()
        ray.shutdown()
    return rows


def run_all(index_dir: Path, dataset: Path, build_docs: int, rounds: int, queries: list[str], shard_counts: list[int], peaks: dict) -> dict:
    with tempfile.TemporaryDirectory(prefix="scale-bench-") as tmp:
        work = Path(tmp)
        build = build_rows(dataset, work, build_docs, rounds)
        for row in build["configs"].values():
            row["embed_floor"] = embedding_floor_fraction(work, row["embed_docs_per_s"], peaks)
        coordinator = coordinator_rows(index_dir, work, queries, shard_counts)
        serving = serve_rows(index_dir, work, queries, shard_counts)
    return {
        "cores": peaks["cores"],
        "peaks": peaks,
        "build": build,
        "coordinator": coordinator,
        "serving": serving,
        "documents": open_index(index_dir, verify="size").num_docs,
    }


def _scale(ctx) -> list[Table]:
    r = run_all(
        ctx.untuned_index,
        ctx.data,
        ctx.size(600, 40),
        ctx.size(2, 1),
        ctx.queries()[: ctx.size(100, 10)],
        [2, 4, 8] if not ctx.quick else [2],
        ctx.peaks,
    )
    build, coordinator = r["build"], r["coordinator"]
    builds = [
        {
            "build": name,
            "embedding docs/s": row["embed_docs_per_s"],
            "whole build docs/s": row["build_docs_per_s"],
            "fraction of peak": row["embed_floor"]["fraction"],
        }
        for name, row in build["configs"].items()
    ]
    whole = coordinator["rows"]["whole"]["p50_ms"]
    coordinated = [
        {
            "index": name,
            "p50 ms": row["p50_ms"],
            "p99 ms": row["p99_ms"],
            "ratio to whole": round(row["p50_ms"] / whole, 3),
            "merge p50 ms": row["merge_p50_ms"],
            "answers equal to the whole index's": f"{row['same_answers']} of {coordinator['queries']}",
        }
        for name, row in coordinator["rows"].items()
    ]
    serving = dict(r["serving"])
    calls = serving.pop("calls")
    served = []
    for count, row in serving.items():
        whole_row = row["hybrid serve, whole"]
        ray_row = next(v for k, v in row.items() if k.startswith("Ray Serve"))
        served.append(
            {
                "shards": int(count),
                "whole p50 ms": whole_row["p50_ms"],
                "Ray Serve p50 ms": ray_row["p50_ms"],
                "Ray Serve p99 ms": ray_row["p99_ms"],
                "overhead p50 ms": round(ray_row["p50_ms"] - whole_row["p50_ms"], 3),
            }
        )
    call_rows = rows_from(calls["rows"], "call", {"one_p50_ms": "one p50 ms", "fan_out_p50_ms": f"{calls['fan_out']} at once p50 ms"})
    return [
        Table(
            f"building the first {build['documents']} documents, {build['rounds']} alternating rounds (a local Ray "
            f"instance started once in {build['ray_start_s']} s, not counted)",
            builds,
        ),
        Table(
            f"the coordinator in one process: hybrid k=10 over the index whole and split, {coordinator['queries']} queries interleaved",
            coordinated,
        ),
        Table(
            "over HTTP on loopback: Ray Serve (one replica a shard) beside `hybrid serve` of the whole index, requests alternating", served
        ),
        Table("one call with a query vector as payload: a Serve deployment handle vs a plain Ray actor", call_rows),
    ]


CASES = [
    Case(
        "Scale-out",
        "Scale-out on Ray",
        "Ray builds vs one process, the coordinator's cost by shard count, Ray Serve vs `hybrid serve` (one machine)",
        _scale,
        needs=("ray",),
    )
]
