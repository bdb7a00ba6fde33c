"""Live writes measured on scifact: ingest throughput, write-to-visible latency, search with a live segment vs
compacted, compaction time, and a mixed search + write load over loopback HTTP.

    python -m bench.live_bench DATA/scifact WORKDIR [--out live.json] [--markdown] [--seconds 60]

Builds (once) an index of the corpus without every tenth document, then writes those documents (10% of the
collection) through the service's API and measures side by side in one run.
"""

from __future__ import annotations

import argparse
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

from hybrid_retrieval.evaluation.server import running_server
from hybrid_retrieval.indexer.build import EMBED_BATCH, BuildOptions, build_index, index_is_current
from hybrid_retrieval.indexer.corpus import indexed_text, read_corpus, split_queries
from hybrid_retrieval.indexer.live import Collection
from hybrid_retrieval.indexer.store import MODEL_DIR, open_index
from hybrid_retrieval.models.embedder import OnnxEmbedder
from hybrid_retrieval.search.spec import HubnessSpec
from hybrid_retrieval.training.hubness import fit_from_bank

KEY = "live-bench-writer"
HUBNESS = HubnessSpec("dbnorm", dynamic=True)
SEARCH_MODES = {"bm25": {"mode": "bm25"}, "hybrid": {"mode": "hybrid"},
                "hybrid_dbnorm": {"mode": "hybrid", "hubness": {"method": HUBNESS.method, "dynamic": HUBNESS.dynamic}}}
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
        fit_from_bank(workdir / "base", dataset / "queries.jsonl", HUBNESS, split_qrels=dataset / "qrels" / "train.tsv", tune=False)
    return workdir / "base"


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


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
                hits = client.post("/search", json={"query": token, "mode": "bm25", "k": 1}).json()["hits"]
                if hits:
                    break
                time.sleep(0.005)
            latencies.append((time.perf_counter() - acked) * 1000)
    return {"samples": samples, "p50_ms": round(percentile(latencies, 50), 1), "p99_ms": round(percentile(latencies, 99), 1)}


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
    return {"p50_ms": p50, **{f"{mode}_ratio": round(p50[f"live {mode}"] / p50[f"compacted {mode}"], 3) for mode in SEARCH_MODES},
            "compaction_s": round(compaction_s, 2), "live_documents": len(live.snapshot.live), "documents": live.snapshot.documents}


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
        return {"searches": len(latencies), "errors": int(sum(errors)), "written_documents": len(acknowledged), "lost": lost,
                "search_p50_ms": round(percentile(latencies, 50), 1), "search_p99_ms": round(percentile(latencies, 99), 1)}

    idle, busy = phase(False), phase(True)
    return {"seconds": seconds, "searchers": searchers, "writers": writers, "idle": idle, "with_writes": busy,
            "p50_ratio": round(busy["search_p50_ms"] / idle["search_p50_ms"], 3)}


def run(dataset: Path, workdir: Path, seconds: float, split: str = "test") -> dict:
    documents = _documents(dataset)
    held_out, kept = documents[::10], [d for i, d in enumerate(documents) if i % 10]
    base = base_index(dataset, workdir, kept)
    live_dir = workdir / "live"
    if live_dir.exists():
        shutil.rmtree(live_dir)
    shutil.copytree(base, live_dir)
    queries = list(split_queries(dataset, split)[0].values())
    report = {"documents": len(documents), "base_documents": len(kept), "written": len(held_out)}
    before = offline_embedding(base, held_out)
    with running_server(live_dir, ENV) as (url, _):
        report["ingest"] = ingest(url, held_out)
    offline = (before + offline_embedding(base, held_out)) / 2  # before and after the ingest: the same moment, on average
    report["offline_embedding_docs_per_s"] = round(offline, 1)
    report["ingest_ratio"] = round(report["ingest"]["docs_per_s"] / offline, 3)
    with running_server(live_dir, ENV) as (url, _):
        report["visibility"] = visibility(url)
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


def _load_sentence(load: dict, how: str) -> str:
    idle, busy = load["idle"], load["with_writes"]
    return (f"{how}: search p50 {idle['search_p50_ms']:.0f} ms idle vs {busy['search_p50_ms']:.0f} ms with writes "
            f"({load['p50_ratio']:.2f}x), p99 {idle['search_p99_ms']:.0f} vs {busy['search_p99_ms']:.0f} ms; "
            f"{idle['errors'] + busy['errors']} errors, {busy['written_documents']:,} documents written, {busy['lost']} lost.")


def markdown(report: dict) -> str:
    ing, vis, search, load = report["ingest"], report["visibility"], report["search"], report["mixed_load"]
    p50 = search["p50_ms"]
    return "\n".join([
        "## Live writes (`python -m bench.live_bench`)", "",
        f"scifact without every tenth document ({report['base_documents']:,} documents built offline, DBNorm fitted "
        f"with the train queries), then the other {report['written']:,} written through `PUT /documents` on loopback "
        f"(batches of {ing['batch']}).", "",
        "| measurement | value |", "|---|---:|",
        f"| ingest through the API | {ing['docs_per_s']:.1f} docs/s ({ing['seconds']:.1f} s) |",
        f"| offline build's embedding stage over the same documents (before and after the ingest) | "
        f"{report['offline_embedding_docs_per_s']:.1f} docs/s |",
        f"| ingest / offline | {report['ingest_ratio']:.2f}x |",
        f"| write-to-visible, p50 / p99 ({vis['samples']} single-document writes, refresh every 1 s) | "
        f"{vis['p50_ms']:.0f} / {vis['p99_ms']:.0f} ms |",
        f"| BM25 p50, {search['live_documents']} live documents vs compacted | {p50['live bm25']:.3f} vs "
        f"{p50['compacted bm25']:.3f} ms ({search['bm25_ratio']:.2f}x) |",
        f"| hybrid p50, live vs compacted | {p50['live hybrid']:.2f} vs {p50['compacted hybrid']:.2f} ms "
        f"({search['hybrid_ratio']:.2f}x) |",
        f"| hybrid + DBNorm (DIS) p50, live vs compacted (the fitted correction extended to the writes) | "
        f"{p50['live hybrid_dbnorm']:.2f} vs {p50['compacted hybrid_dbnorm']:.2f} ms ({search['hybrid_dbnorm_ratio']:.2f}x) |",
        f"| compaction of {search['documents']:,} documents (vectors reused) | {search['compaction_s']:.1f} s |", "",
        f"Mixed load on loopback, {load['searchers']} search clients for {load['seconds']:.0f} s alone, then again with "
        f"{load['writers']} clients writing batches of 4 (then every written id is read back), each configuration from a "
        "copy of the same collection, background compaction on. "
        + _load_sentence(load, "The default (writes embedded on all cores while no search runs, on half of them while "
                               "searches run)") + " "
        + _load_sentence(report["mixed_load_all_cores"], "Writes always on all cores (`HYBRID_WRITE_THREADS` = cores)"), ""])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dataset", type=Path)
    parser.add_argument("workdir", type=Path)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--seconds", type=float, default=60.0, help="each phase of the mixed load")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    report = run(args.dataset, args.workdir, args.seconds)
    if args.out:
        args.out.write_text(json.dumps(report, indent=2))
    print(markdown(report) if args.markdown else json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
