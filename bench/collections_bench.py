"""Collections: how fast an application fills one through the API against the offline build of the same documents,
and what searching costs as more collections are open in one service.

Bulk load: the first documents of the dataset, loaded by `PUT /collections/{name}/documents?wait=false` (NDJSON, one
task) into a fresh collection until searchable, alternating round by round with `hybrid index --collection` building
the same documents into the same data directory. Open collections: one collection loaded through the API, then copies
of its folder published into the data directory (the service serves them within a refresh interval), searched with the
same queries at 1, 10 and 50 collections open.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from bench.harness import Case, Table, compare, percentiles
from hybrid_retrieval.evaluation.server import running_server
from hybrid_retrieval.indexer.manifest import read_manifest

KEY = "collections-bench"
HEADERS = {"X-API-Key": KEY}
BUILD_STAGES = ("documents_s", "bm25_s", "embeddings_s", "faiss_s")


def _env(data: Path) -> dict[str, str]:
    return {"HYBRID_DATA": str(data), "HYBRID_WRITE_KEYS": KEY, "HYBRID_VERIFY": "size", "HYBRID_REFRESH_INTERVAL": "0.2"}


def _documents(dataset: Path, count: int) -> list[dict]:
    with (dataset / "corpus.jsonl").open() as fh:
        rows = [json.loads(line) for line in itertools.islice(fh, count)]
    return [{"id": r["_id"], "title": r.get("title", ""), "text": r["text"], "metadata": r.get("metadata", {})} for r in rows]


def _wait(check, timeout_s: float = 1800) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError("timed out")
        time.sleep(0.05)


def _api_load(client: httpx.Client, name: str, body: str, count: int) -> float:
    """Seconds from the request to the last document being searchable."""
    assert client.post("/collections", json={"name": name}).status_code == 201
    started = time.perf_counter()
    response = client.put(f"/collections/{name}/documents?wait=false", content=body, headers={"Content-Type": "application/x-ndjson"})
    response.raise_for_status()
    _wait(lambda: client.get(f"/collections/{name}").json()["documents"] == count)
    seconds = time.perf_counter() - started
    task = client.get(f"/tasks/{response.json()['id']}").json()
    if task["state"] != "succeeded":
        raise RuntimeError(f"the load failed: {task}")
    return seconds


def _offline_build(corpus: Path, data: Path, name: str) -> float:
    """Seconds the offline build spent in its stages (documents, BM25, embeddings, FAISS: the manifest's build times),
    without starting Python and loading the model, which the running service had done before its load."""
    command = [sys.executable, "-m", "hybrid_retrieval.cli", "index", str(corpus), "--collection", name, "--data", str(data), "--quiet"]
    subprocess.run(command, check=True, capture_output=True)
    build = read_manifest(data / "collections" / name).build
    return float(sum(build[stage] for stage in BUILD_STAGES))


def bulk_load(dataset: Path, count: int, rounds: int) -> dict:
    docs = _documents(dataset, count)
    with tempfile.TemporaryDirectory(prefix="collections-bench-") as tmp:
        data, corpus = Path(tmp) / "data", Path(tmp) / "corpus.jsonl"
        corpus.write_text(
            "".join(json.dumps({"_id": d["id"], "title": d["title"], "text": d["text"], "metadata": d["metadata"]}) + "\n" for d in docs)
        )
        body = "".join(json.dumps(d) + "\n" for d in docs)
        api, offline = [], []
        with running_server(None, _env(data)) as (url, _), httpx.Client(base_url=url, timeout=600, headers=HEADERS) as client:
            for round_no in range(rounds):  # alternating, so that machine noise hits both alike
                offline.append(count / _offline_build(corpus, data, f"offline-{round_no}"))
                api.append(count / _api_load(client, f"api-{round_no}", body, count))
    return {"documents": count, "rounds": rounds, "api": api, "offline": offline}


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return float("nan")


def open_collections(dataset: Path, queries: list[str], count: int, steps: tuple[int, ...]) -> dict:
    docs = _documents(dataset, count)
    body = "".join(json.dumps(d) + "\n" for d in docs)
    rows = {}
    with tempfile.TemporaryDirectory(prefix="collections-bench-") as tmp:
        data = Path(tmp) / "data"
        with running_server(None, _env(data)) as (url, process), httpx.Client(base_url=url, timeout=600, headers=HEADERS) as client:
            _api_load(client, "c00", body, count)
            client.post("/collections/c00/compact").raise_for_status()  # every copy starts from one base segment
            source = data / "collections" / "c00"
            served = 1
            for step in steps:
                for i in range(served, step):  # publish copies whole (a hidden folder renamed into place)
                    hidden = data / "collections" / f".copy-c{i:02d}"
                    shutil.copytree(
                        source, hidden, ignore=shutil.ignore_patterns("live"), copy_function=os.link
                    )  # files never change in place
                    os.rename(hidden, data / "collections" / f"c{i:02d}")
                _wait(lambda step=step: len(client.get("/collections").json()["collections"]) == step, 600)
                served = step
                for query in queries[:3]:  # warm-up
                    client.post("/collections/c00/search", json={"query": query, "k": 10})
                times = []
                for query in queries:
                    started = time.perf_counter()
                    client.post("/collections/c00/search", json={"query": query, "k": 10}).raise_for_status()
                    times.append((time.perf_counter() - started) * 1000)
                rows[step] = {"times": times, "rss_mib": _rss_mib(process.pid)}
    return {"documents": count, "queries": len(queries), "rows": rows}


def _bulk_load(ctx) -> list[Table]:
    r = bulk_load(ctx.data, ctx.size(1500, 100), ctx.size(3, 1))
    ratio = compare(r["api"], r["offline"], higher_is_better=True)
    row = {
        "documents": r["documents"],
        "rounds": r["rounds"],
        "API load docs/s (median)": round(sorted(r["api"])[len(r["api"]) // 2], 1),
        "offline build docs/s (median)": round(sorted(r["offline"])[len(r["offline"]) // 2], 1),
        "API / offline": ratio["ratio"],
        "p": ratio["p"],
        "API / offline >= 0.8": ratio["ratio"] >= 0.8,
    }
    return [
        Table(
            f"the first {r['documents']} documents of {ctx.data.name}, loaded through the API and built offline, "
            f"{r['rounds']} rounds alternating",
            [row],
            "API: from the PUT (NDJSON, ?wait=false, one task) to the last document searchable, the service already "
            "running. Offline: `hybrid index --collection` into the same data directory, the sum of its stages' times "
            "(documents, BM25, embeddings, FAISS: without starting Python and loading the model, done before the API load).",
        )
    ]


def _open_collections(ctx) -> list[Table]:
    steps = (1, 10, 50) if not ctx.quick else (1, 3)
    r = open_collections(ctx.data, ctx.queries()[: ctx.size(100, 10)], ctx.size(1000, 50), steps)
    first = r["rows"][steps[0]]["times"]
    table = []
    for step, row in r["rows"].items():
        versus = compare(row["times"], first)
        table.append(
            {
                "collections open": step,
                **percentiles(row["times"]),
                "p50 vs 1 open": versus["ratio"],
                "p": versus["p"],
                "verdict": versus["verdict"],
                "server RSS MiB": row["rss_mib"],
            }
        )
    return [
        Table(
            f"hybrid k=10 over HTTP on one collection of {r['documents']} documents, {r['queries']} queries one at a "
            "time, with more collections open beside it (copies of it: one model session for all)",
            table,
            "The steps run one after another in one service (not interleaved): `p` compares each step's latencies with the first's.",
        )
    ]


CASES = [
    Case("Collections", "API bulk load vs offline build", "documents/s through PUT ?wait=false vs `hybrid index --collection`", _bulk_load),
    Case(
        "Collections",
        "Search with many collections open",
        "hybrid search latency and memory at 1, 10, 50 open collections",
        _open_collections,
    ),
]
