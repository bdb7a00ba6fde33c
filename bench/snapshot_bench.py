"""Snapshots: how long one takes and restores, how big it is, and what searches notice while one is taken.

The served scifact index (tuned, hubness fitted) is hard-linked into a data directory as a collection. Time and size:
`POST /collections/{name}/snapshots` and `POST /collections/{copy}/snapshots/restore` (from the listed snapshot) over
HTTP, each repeated. Pause: two clients search without pause (closed loop, hybrid k=10) through alternating windows:
one without snapshots, one with snapshots taken back to back; latencies are compared window kind against window kind.
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np

from bench.harness import Case, Table, compare, percentiles
from hybrid_retrieval.evaluation.server import running_server
from hybrid_retrieval.indexer.leftovers import folder_bytes

KEY = "snapshot-bench"
HEADERS = {"X-API-Key": KEY}
NAME = "scifact"


def _searching(url: str, queries: list[str], stop: threading.Event, times: list[float]) -> None:
    with httpx.Client(base_url=url, timeout=120, headers=HEADERS) as client:
        i = 0
        while not stop.is_set():
            started = time.perf_counter()
            client.post(f"/collections/{NAME}/search", json={"query": queries[i % len(queries)], "k": 10}).raise_for_status()
            times.append((time.perf_counter() - started) * 1000)
            i += 1


def _writing(url: str, dimension: int, stop: threading.Event, times: list[float]) -> None:
    """One closed-loop writer: upserts of one document (bringing its vector, so the write is logging and applying,
    not embedding), over 50 ids so the live segment stays small."""
    rng = np.random.default_rng(0)
    with httpx.Client(base_url=url, timeout=120, headers=HEADERS) as client:
        i = 0
        while not stop.is_set():
            vector = rng.normal(size=dimension)
            doc = {
                "id": f"bench-{i % 50}",
                "text": f"a note written during the benchmark, number {i}",
                "vector": (vector / np.linalg.norm(vector)).tolist(),
            }
            started = time.perf_counter()
            client.put(f"/collections/{NAME}/documents", json={"documents": [doc]}).raise_for_status()
            times.append((time.perf_counter() - started) * 1000)
            i += 1


def _snapshotting(client: httpx.Client, stop: threading.Event, seconds: list[float]) -> None:
    while not stop.is_set():
        started = time.perf_counter()
        client.post(f"/collections/{NAME}/snapshots").raise_for_status()
        seconds.append(time.perf_counter() - started)


def _window(
    url: str, client: httpx.Client, queries: list[str], dimension: int, seconds: float, with_snapshots: bool
) -> tuple[list[float], list[float], list[float]]:
    """Search latencies (ms) of two closed-loop clients and write latencies (ms) of one writer over `seconds`, and
    the durations (s) of the snapshots taken back to back meanwhile (none without `with_snapshots`)."""
    stop, times, writes, snapshots = threading.Event(), [], [], []
    errors: list[BaseException] = []

    def guarded(work, *args) -> None:
        try:
            work(*args)
        except BaseException as exc:  # raised in the caller's thread below
            errors.append(exc)
            stop.set()

    workers = [threading.Thread(target=guarded, args=(_searching, url, queries, stop, times)) for _ in range(2)]
    workers.append(threading.Thread(target=guarded, args=(_writing, url, dimension, stop, writes)))
    if with_snapshots:
        workers.append(threading.Thread(target=guarded, args=(_snapshotting, client, stop, snapshots)))
    for worker in workers:
        worker.start()
    stop.wait(seconds)
    stop.set()
    for worker in workers:
        worker.join()
    if errors:
        raise errors[0]
    return times, writes, snapshots


def measure(index: Path, queries: list[str], repeats: int, window_s: float, windows: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="snapshot-bench-", dir=index.parent) as tmp:  # same filesystem: links
        data = Path(tmp) / "data"
        source = data / "collections" / NAME
        source.parent.mkdir(parents=True)
        shutil.copytree(index, source, ignore=shutil.ignore_patterns("live"), copy_function=os.link)  # files never change in place
        env = {"HYBRID_DATA": str(data), "HYBRID_WRITE_KEYS": KEY, "HYBRID_VERIFY": "size", "HYBRID_SNAPSHOT_KEEP": "1"}
        with running_server(None, env) as (url, _), httpx.Client(base_url=url, timeout=1200, headers=HEADERS) as client:
            taken, restored, info = [], [], {}
            for i in range(repeats):
                started = time.perf_counter()
                info = client.post(f"/collections/{NAME}/snapshots").json()
                taken.append(time.perf_counter() - started)
                started = time.perf_counter()
                client.post(f"/collections/copy-{i}/snapshots/restore", json={"snapshot": info["id"]}).raise_for_status()
                restored.append(time.perf_counter() - started)
                client.delete(f"/collections/copy-{i}").raise_for_status()
            for query in queries[:5]:  # warm-up
                client.post(f"/collections/{NAME}/search", json={"query": query, "k": 10})
            dimension = client.get(f"/collections/{NAME}").json()["settings"]["embedder"]["dimension"]
            quiet, busy, quiet_writes, busy_writes, during = [], [], [], [], []
            for _ in range(windows):  # alternating, so that machine noise hits both kinds alike
                times, writes, _ = _window(url, client, queries, dimension, window_s, with_snapshots=False)
                quiet, quiet_writes = quiet + times, quiet_writes + writes
                times, writes, snapshots = _window(url, client, queries, dimension, window_s, with_snapshots=True)
                busy, busy_writes, during = busy + times, busy_writes + writes, during + snapshots
        return {
            "documents": info["documents"],
            "snapshot_bytes": info["bytes"],
            "folder_bytes": folder_bytes(source),
            "snapshot_s": taken,
            "restore_s": restored,
            "quiet_ms": quiet,
            "busy_ms": busy,
            "quiet_write_ms": quiet_writes,
            "busy_write_ms": busy_writes,
            "snapshots_during": len(during),
            "snapshot_during_s": during,
        }


def _snapshots(ctx) -> list[Table]:
    r = measure(ctx.index, ctx.queries(), ctx.size(5, 2), ctx.size(20, 3), ctx.size(3, 1))
    sizes = {
        "documents": r["documents"],
        "index folder MiB": round(r["folder_bytes"] / 2**20, 1),
        "snapshot MiB": round(r["snapshot_bytes"] / 2**20, 1),
        "snapshot s (median)": round(statistics.median(r["snapshot_s"]), 3),
        "restore s (median)": round(statistics.median(r["restore_s"]), 3),
        "repeats": len(r["snapshot_s"]),
        "snapshot s while searched (median)": round(statistics.median(r["snapshot_during_s"]), 3) if r["snapshot_during_s"] else None,
    }
    versus = compare(r["busy_ms"], r["quiet_ms"])
    writes_versus = compare(r["busy_write_ms"], r["quiet_write_ms"])
    pause = [
        {"window": window, **_latencies("search", r[f"{kind}_ms"]), **_latencies("write", r[f"{kind}_write_ms"])}
        for window, kind in (("no snapshot", "quiet"), (f"snapshots back to back ({r['snapshots_during']} taken)", "busy"))
    ]
    p99 = pause[1]["search p99_ms"] / pause[0]["search p99_ms"]
    return [
        Table(
            f"snapshot and restore of the {ctx.data.name} collection over HTTP (tuned, hubness fitted, with its model)",
            [sizes],
            "Snapshot: POST /collections/{name}/snapshots until answered (the file complete and fsync'ed). Restore: POST "
            "/collections/{copy}/snapshots/restore from the listed snapshot until the restored collection serves. The "
            "snapshot holds the whole index folder, the ONNX model included, uncompressed.",
        ),
        Table(
            "hybrid k=10 search latency of two closed-loop clients and upsert latency of one writer, without and during snapshots",
            pause,
            f"Windows of equal length alternate (without, during). During / without, searches: p50 {versus['ratio']} (p "
            f"{versus['p']}, {versus['verdict']}), p99 {p99:.3f}; writes: p50 {writes_versus['ratio']} (p "
            f"{writes_versus['p']}, {writes_versus['verdict']}). Each write brings its vector (one document, 50 ids). "
            "A snapshot blocks no search or write: it holds the write "
            "lock while it reads the log's length and holds compactions off while it hard-links the files; what "
            "searches feel is the CPU and disk that the archive's checksums and copy take beside them.",
        ),
    ]


def _latencies(what: str, values_ms: list[float]) -> dict:
    return {
        f"{what} count": len(values_ms),
        **{f"{what} {key}": value for key, value in percentiles(values_ms).items()},
        f"{what} max_ms": round(max(values_ms), 1),
    }


CASES = [
    Case(
        "Snapshots",
        "Snapshot and restore",
        "time and size of a snapshot and a restore of the scifact collection; search latency during snapshots",
        _snapshots,
    ),
]
