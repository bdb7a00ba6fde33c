"""Live writes measured on the dataset: ingest throughput, write-to-visible latency, search with a live segment vs
compacted, compaction time, and a mixed search + write load over loopback HTTP.

Builds (once) an index of the corpus without every tenth document, then writes those documents (10% of the
collection) through the service's API and measures side by side in one run.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import statistics
import threading
import time
from pathlib import Path

import httpx
import numpy as np

from bench.harness import Case, Table, percentiles, verdict
from hybrid_retrieval.evaluation.server import running_server
from hybrid_retrieval.indexer.build import EMBED_BATCH, BuildOptions, build_index, index_is_current
from hybrid_retrieval.indexer.corpus import indexed_text, read_corpus
from hybrid_retrieval.indexer.live.collection import Collection
from hybrid_retrieval.indexer.store import MODEL_DIR, open_index
from hybrid_retrieval.models.embedder import OnnxEmbedder
from hybrid_retrieval.search.spec import HubnessSpec
from hybrid_retrieval.training.hubness import fit_hubness_from_bank

KEY = "live-bench-writer"
HUBNESS = HubnessSpec("dbnorm", dynamic=True)
SEARCH_MODES = {
    "bm25": {"mode": "bm25"},
    "hybrid": {"mode": "hybrid"},
    "hybrid_dbnorm": {"mode": "hybrid", "hubness": {"method": HUBNESS.method, "dynamic": HUBNESS.dynamic}},
}
ENV = {"HYBRID_WRITE_KEYS": KEY, "HYBRID_VERIFY": "size", "HYBRID_COMPACT_MIN_DOCS": "1000000"}
HEADERS = {"X-API-Key": KEY}


def _documents(dataset: Path) -> list[dict]:
    return [{"id": d.doc_id, "title": d.title, "text": d.text, "metadata": d.metadata} for d in read_corpus(dataset)]


def base_index(dataset: Path, workdir: Path, kept: list[dict]) -> Path:
    workdir.mkdir(parents=True, exist_ok=True)
    corpus = workdir / "base.jsonl"
    corpus.write_text("".join(json.dumps({"_id": d["id"], "title": d["title"], "text": d["text"]}) + "\n" for d in kept))
    if not index_is_current(corpus, workdir / "base"):
        build_index(corpus, workdir / "base", BuildOptions(progress=False))
    if open_index(workdir / "base", verify="size").manifest.hubness is None:  # written documents get biases from its banks
        fit_hubness_from_bank(workdir / "base", dataset / "queries.jsonl", HUBNESS, split_qrels=dataset / "qrels" / "train.tsv", tune=False)
    return workdir / "base"


def offline_embedding(index_dir: Path, documents: list[dict]) -> float:
    """Documents per second of the offline build's embedding stage (its ONNX model, its batch size) over the same
    documents the API ingests, measured in this run."""
    embedder = OnnxEmbedder(index_dir / MODEL_DIR, device="cpu")
    texts = [indexed_text(d["title"], d["text"]) for d in documents]
    embedder.encode(texts[:EMBED_BATCH], batch_size=EMBED_BATCH)  # warm up
    start = time.perf_counter()
    embedder.encode(texts, batch_size=EMBED_BATCH)
    return len(texts) / (time.perf_counter() - start)


def ingest(url: str, documents: list[dict], batch: int = 64) -> dict:
    """Upsert through the API in batches (no wait): documents per second."""
    with httpx.Client(base_url=url, timeout=120, headers=HEADERS) as client:
        start = time.perf_counter()
        for i in range(0, len(documents), batch):
            client.put("/documents", json={"documents": documents[i : i + batch]}).raise_for_status()
        seconds = time.perf_counter() - start
    return {"documents": len(documents), "batch": batch, "seconds": round(seconds, 2), "docs_per_s": round(len(documents) / seconds, 1)}


def visibility(url: str, samples: int = 30) -> dict:
    """Milliseconds from a single-document write's acknowledgement until a search finds it (default refresh, 1 s)."""
    latencies = []
    rng = np.random.default_rng(0)
    with httpx.Client(base_url=url, timeout=30, headers=HEADERS) as client:
        for i in range(samples):
            time.sleep(rng.uniform(0, 1.0))  # arrive at any point of the refresh cycle, as independent writers do
            token = f"vzq{i}x{int(time.time() * 1000)}"
            client.put("/documents", json={"documents": [{"id": f"vis-{i}", "text": f"{token} visibility probe"}]}).raise_for_status()
            acked = time.perf_counter()
            while True:
                # typo 0: the token must match exactly (an earlier probe's token may be within the typo budget)
                hits = client.post("/search", json={"query": token, "mode": "bm25", "k": 1, "typo": 0}).json()["hits"]
                if hits:
                    break
                time.sleep(0.005)
            latencies.append((time.perf_counter() - acked) * 1000)
    return {"samples": samples, **percentiles(latencies)}


def live_vs_compacted(index_dir: Path, workdir: Path, queries: list[str], rounds: int = 2) -> dict:
    """BM25 and hybrid p50 over the live collection (10% live) and over a compacted copy, interleaved per query."""
    compacted_dir = workdir / "compacted"
    if compacted_dir.exists():
        shutil.rmtree(compacted_dir)
    shutil.copytree(index_dir, compacted_dir)
    live = Collection(open_index(index_dir, verify="size", device="cpu"))
    copy = Collection(open_index(compacted_dir, verify="size", device="cpu", embedder=live.index.embedder))
    start = time.perf_counter()
    copy.compact()
    compaction_s = time.perf_counter() - start
    pipelines = {"live": live.refresh().pipeline(), "compacted": copy.snapshot.pipeline()}
    times = {(view, mode): [] for view in pipelines for mode in SEARCH_MODES}
    for _ in range(rounds):
        for query in queries:
            for view, pipeline in pipelines.items():
                for mode, spec in SEARCH_MODES.items():
                    times[(view, mode)].append(pipeline.search(query, 10, spec).timings_ms["total"])
    p50 = {f"{view} {mode}": round(statistics.median(v), 3) for (view, mode), v in times.items()}
    live.close()
    copy.close()
    return {
        "p50_ms": p50,
        **{f"{mode}_ratio": round(p50[f"live {mode}"] / p50[f"compacted {mode}"], 3) for mode in SEARCH_MODES},
        "compaction_s": round(compaction_s, 2),
        "live_documents": len(live.snapshot.live),
        "documents": live.snapshot.documents,
    }


def mixed_load(url: str, queries: list[str], seconds: float, searchers: int = 16, writers: int = 2) -> dict:
    """`searchers` search clients for `seconds` alone, then again beside `writers` writing clients: errors, lost writes,
    search p50/p99 in both phases."""

    def phase(with_writes: bool) -> dict:
        stop_at = time.monotonic() + seconds
        latencies, errors, acknowledged = [], [], []
        counter = itertools.count()

        def search():
            with httpx.Client(base_url=url, timeout=30, headers=HEADERS) as client:
                while time.monotonic() < stop_at:
                    start = time.perf_counter()
                    try:
                        ok = client.post("/search", json={"query": queries[next(counter) % len(queries)]}).status_code == 200
                    except httpx.HTTPError:
                        ok = False
                    latencies.append((time.perf_counter() - start) * 1000)
                    errors.append(not ok)

        def write(writer: int):
            with httpx.Client(base_url=url, timeout=60, headers=HEADERS) as client:
                for n in itertools.count():
                    if time.monotonic() >= stop_at:
                        return
                    docs = [{"id": f"load-{writer}-{n}-{j}", "text": f"load test document {writer} {n} {j}"} for j in range(4)]
                    try:
                        ok = client.put("/documents", json={"documents": docs}).status_code == 200
                    except httpx.HTTPError:
                        ok = False
                    errors.append(not ok)
                    if ok:
                        acknowledged.extend(d["id"] for d in docs)

        threads = [threading.Thread(target=search) for _ in range(searchers)]
        threads += [threading.Thread(target=write, args=(w,)) for w in range(writers if with_writes else 0)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        with httpx.Client(base_url=url, timeout=30, headers=HEADERS) as client:
            lost = sum(client.get(f"/documents/{doc_id}").status_code != 200 for doc_id in acknowledged)
        return {
            "searches": len(latencies),
            "errors": int(sum(errors)),
            "written_documents": len(acknowledged),
            "lost": lost,
            **{f"search_{name}": value for name, value in percentiles(latencies).items()},
        }

    idle, busy = phase(False), phase(True)
    return {
        "seconds": seconds,
        "searchers": searchers,
        "writers": writers,
        "idle": idle,
        "with_writes": busy,
        "p50_ratio": round(busy["search_p50_ms"] / idle["search_p50_ms"], 3),
    }


def run(dataset: Path, workdir: Path, seconds: float, queries: list[str], samples: int) -> dict:
    documents = _documents(dataset)
    held_out, kept = documents[::10], [d for i, d in enumerate(documents) if i % 10]
    base = base_index(dataset, workdir, kept)
    live_dir = workdir / "live"
    if live_dir.exists():
        shutil.rmtree(live_dir)
    shutil.copytree(base, live_dir)
    report = {"documents": len(documents), "base_documents": len(kept), "written": len(held_out)}
    before = offline_embedding(base, held_out)
    with running_server(live_dir, ENV) as (url, _):
        report["ingest"] = ingest(url, held_out)
    offline = (before + offline_embedding(base, held_out)) / 2  # before and after the ingest: the same moment, on average
    report["offline_embedding_docs_per_s"] = round(offline, 1)
    report["ingest_ratio"] = round(report["ingest"]["docs_per_s"] / offline, 3)
    with running_server(live_dir, ENV) as (url, _):
        report["visibility"] = visibility(url, samples)
    report["search"] = live_vs_compacted(live_dir, workdir, queries)
    # Each load configuration starts from the same collection (a copy) and runs with the service's own background
    # compaction, as it would in production.
    load_env = {k: v for k, v in ENV.items() if k != "HYBRID_COMPACT_MIN_DOCS"}
    cores = str(len(os.sched_getaffinity(0)))
    for name, env in (("mixed_load", load_env), ("mixed_load_all_cores", {**load_env, "HYBRID_WRITE_THREADS": cores})):
        run_dir = workdir / "load"
        if run_dir.exists():
            shutil.rmtree(run_dir)
        shutil.copytree(live_dir, run_dir)
        with running_server(run_dir, env) as (url, _):
            report[name] = mixed_load(url, queries, seconds)
    return report


def _live(ctx) -> list[Table]:
    r = run(ctx.data, ctx.work / "live", ctx.size(60, 2), ctx.queries()[: ctx.size(10_000, 20)], ctx.size(30, 3))
    ing, vis, search = r["ingest"], r["visibility"], r["search"]
    writes = [
        {"measurement": "ingest through the API, docs/s", "value": ing["docs_per_s"]},
        {"measurement": "the offline build's embedding stage on the same documents, docs/s", "value": r["offline_embedding_docs_per_s"]},
        {"measurement": "ingest / offline", "value": r["ingest_ratio"]},
        {"measurement": f"write-to-visible p50 ms ({vis['samples']} single-document writes, refresh every 1 s)", "value": vis["p50_ms"]},
        {"measurement": "write-to-visible p99 ms", "value": vis["p99_ms"]},
        {"measurement": f"compaction of {search['documents']:,} documents (vectors reused), s", "value": search["compaction_s"]},
    ]
    live = [
        {
            "search": mode,
            "live p50 ms": search["p50_ms"][f"live {mode}"],
            "compacted p50 ms": search["p50_ms"][f"compacted {mode}"],
            "ratio": search[f"{mode}_ratio"],
            "verdict": verdict(search[f"{mode}_ratio"], higher_is_better=False),
        }
        for mode in SEARCH_MODES
    ]
    load = [
        {
            "writes embedded on": how,
            "phase": phase,
            "searches": row["searches"],
            "search p50 ms": row["search_p50_ms"],
            "search p99 ms": row["search_p99_ms"],
            "errors": row["errors"],
            "written": row["written_documents"],
            "lost": row["lost"],
        }
        for key, how in (("mixed_load", "the default thread policy"), ("mixed_load_all_cores", "all cores"))
        for phase, row in (("searches alone", r[key]["idle"]), ("with writes", r[key]["with_writes"]))
    ]
    return [
        Table(
            f"{r['written']:,} documents written through PUT /documents (batches of {ing['batch']}) onto "
            f"{r['base_documents']:,} built offline",
            writes,
        ),
        Table(f"search p50 with {search['live_documents']} live documents vs compacted, interleaved", live),
        Table(
            f"mixed load: {r['mixed_load']['searchers']} search clients alone, then beside "
            f"{r['mixed_load']['writers']} writing clients, {r['mixed_load']['seconds']:.0f} s each; every written "
            "id read back",
            load,
        ),
    ]


CASES = [
    Case(
        "Live writes",
        "Live writes",
        "the corpus without every tenth document built offline (DBNorm fitted on "
        "the train queries), the rest written through the API of `hybrid serve` on loopback",
        _live,
    )
]
