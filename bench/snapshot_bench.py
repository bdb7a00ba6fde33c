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


def _snapshotting(client: httpx.Client, stop: threading.Event, seconds: list[float]) -> None:
    while not stop.is_set():
        started = time.perf_counter()
        client.post(f"/collections/{NAME}/snapshots").raise_for_status()
        seconds.append(time.perf_counter() - started)


def _window(url: str, client: httpx.Client, queries: list[str], seconds: float, with_snapshots: bool) -> tuple[list[float], list[float]]:
    """Search latencies (ms) of two closed-loop clients over `seconds`, and the durations (s) of the snapshots taken
    back to back meanwhile (none without `with_snapshots`)."""
    stop, times, snapshots = threading.Event(), [], []
    errors: list[BaseException] = []

    def guarded(work, *args) -> None:
        try:
            work(*args)
        except BaseException as exc:  # raised in the caller's thread below
            errors.append(exc)
            stop.set()

    workers = [threading.Thread(target=guarded, args=(_searching, url, queries, stop, times)) for _ in range(2)]
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
    return times, snapshots


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
            quiet, busy, during = [], [], []
            for _ in range(windows):  # alternating, so that machine noise hits both kinds alike
                quiet += _window(url, client, queries, window_s, with_snapshots=False)[0]
                times, snapshots = _window(url, client, queries, window_s, with_snapshots=True)
                busy += times
                during += snapshots
        return {
            "documents": info["documents"],
            "snapshot_bytes": info["bytes"],
            "folder_bytes": folder_bytes(source),
            "snapshot_s": taken,
            "restore_s": restored,
            "quiet_ms": quiet,
            "busy_ms": busy,
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
    pause = [
        {"window": "no snapshot", "searches": len(r["quiet_ms"]), **percentiles(r["quiet_ms"]), "max_ms": round(max(r["quiet_ms"]), 1)},
        {
            "window": f"snapshots back to back ({r['snapshots_during']} taken)",
            "searches": len(r["busy_ms"]),
            **percentiles(r["busy_ms"]),
            "max_ms": round(max(r["busy_ms"]), 1),
        },
    ]
    p99 = pause[1]["p99_ms"] / pause[0]["p99_ms"]
    return [
        Table(
            f"snapshot and restore of the {ctx.data.name} collection over HTTP (tuned, hubness fitted, with its model)",
            [sizes],
            "Snapshot: POST /collections/{name}/snapshots until answered (the file complete and fsync'ed). Restore: POST "
            "/collections/{copy}/snapshots/restore from the listed snapshot until the restored collection serves. The "
            "snapshot holds the whole index folder, the ONNX model included, uncompressed.",
        ),
        Table(
            "hybrid k=10 search latency of two closed-loop clients, without and during snapshots",
            pause,
            f"Windows of equal length alternate (without, during). During / without: p50 {versus['ratio']} (p "
            f"{versus['p']}, {versus['verdict']}), p99 {p99:.3f}. A snapshot blocks no search or write: it holds the write "
            "lock while it reads the log's length and holds compactions off while it hard-links the files; what "
            "searches feel is the CPU and disk that the archive's checksums and copy take beside them.",
        ),
    ]


CASES = [
    Case(
        "Snapshots",
        "Snapshot and restore",
        "time and size of a snapshot and a restore of the scifact collection; search latency during snapshots",
        _snapshots,
    ),
]
