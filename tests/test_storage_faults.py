"""A real server whose index sits on a small filesystem: a full disk answers 507 and loses nothing acknowledged, a
read-only folder answers 503, both reported by /stats and /ready until writes work again; leftovers of killed
builds are removed at startup. And the most expensive requests are bounded by the deadline, the cores idle after."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import httpx
import pytest

from hybrid_retrieval.evaluation.server import running_server

pytestmark = pytest.mark.server  # each test talks to the service (a process, or create_app in this one)

KEY = {"X-API-Key": "w"}
ENV = {"HYBRID_WRITE_KEYS": "w", "HYBRID_REFRESH_INTERVAL": "0.1", "HYBRID_VERIFY": "size"}


@pytest.fixture
def small_disk(tmp_path):
    """A 160 MiB tmpfs (the tiny index takes ~110 MiB); skipped where this process may not mount one."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=160m", "tmpfs", str(mount)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(folder: Path) -> Path:
    """Take every free byte of the filesystem."""
    filler = folder / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        for size in (1 << 20, 4096, 1):
            try:
                while True:
                    os.write(fd, b"\0" * size)
            except OSError:
                pass
    finally:
        os.close(fd)
    return filler


def put(client, doc_id: str):
    return client.put("/documents?wait=true", json={"documents": [{"id": doc_id, "text": f"document {doc_id} " * 20}]})


def test_a_full_disk_answers_507_and_loses_no_acknowledged_write(tiny_index, small_disk):
    index = small_disk / "index"
    shutil.copytree(tiny_index, index)
    acknowledged = []
    env = {**ENV, "HYBRID_SNAPSHOTS": str(small_disk / "snapshots")}
    with running_server(index, env) as (url, _), httpx.Client(base_url=url, headers=KEY, timeout=60) as client:
        assert put(client, "before").status_code == 200
        acknowledged.append("before")
        filler = fill(small_disk)
        failed = [put(client, f"full{n}") for n in range(3)]
        assert [r.status_code for r in failed] == [507] * 3 and "disk is full" in failed[0].json()["detail"]
        (served,) = client.get("/collections").json()["collections"]
        snapshot = client.post(f"/collections/{served['name']}/snapshots")
        assert snapshot.status_code == 507 and "snapshot was not taken" in snapshot.json()["detail"], snapshot.text
        assert not [p for p in (small_disk / "snapshots").iterdir() if p.is_file()]  # nothing of it is kept
        stats = client.get("/stats").json()
        assert stats["writable"] is False and "disk is full" in stats["write_refusal"]
        assert client.get("/ready").json()["writable"] is False
        filler.unlink()
        for n in range(3):
            assert put(client, f"after{n}").status_code == 200
            acknowledged.append(f"after{n}")
        assert client.get("/stats").json()["writable"] is True
    with running_server(index, ENV) as (url, _), httpx.Client(base_url=url, headers=KEY, timeout=60) as client:
        assert [client.get(f"/documents/{i}").status_code for i in acknowledged] == [200] * len(acknowledged)
        assert [client.get(f"/documents/full{n}").status_code for n in range(3)] == [404] * 3


def test_a_read_only_folder_answers_503_and_stats_say_so_until_it_is_writable(tiny_index, small_disk, tmp_path):
    shutil.copytree(tiny_index, small_disk / "index")
    view = tmp_path / "view"  # the same files through a bind mount whose read-only flag we flip
    view.mkdir()
    subprocess.run(["mount", "--bind", str(small_disk), str(view)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(view)], check=True)
        with running_server(view / "index", ENV) as (url, _), httpx.Client(base_url=url, headers=KEY, timeout=60) as client:
            stats = client.get("/stats").json()
            assert stats["writable"] is False and stats["write_refusal"].endswith("is on a read-only filesystem")
            assert client.get("/ready").json()["writable"] is False
            response = put(client, "two")
            assert response.status_code == 503 and "not writable" in response.json()["detail"]
            assert client.delete("/documents/d1").status_code == 503
            subprocess.run(["mount", "-o", "remount,bind,rw", str(view)], check=True)
            assert put(client, "three").status_code == 200
            assert client.get("/stats").json()["writable"] is True
            assert client.get("/documents/d1").status_code == 200
    finally:
        subprocess.run(["umount", "-l", str(view)], check=False)


def test_leftovers_of_killed_builds_are_reported_then_removed_at_startup(tiny_index, tmp_path):
    index = tmp_path / "index"
    shutil.copytree(tiny_index, index)
    left = [tmp_path / f".index.{kind}-{uuid.uuid4().hex[:8]}" for kind in ("building", "compact", "reembed")]
    for folder in left:
        folder.mkdir()
        (folder / "part.npy").write_bytes(b"\0" * 4096)
    other = tmp_path / ".other.building-x"  # not this index's: kept
    other.mkdir()
    with running_server(index, ENV) as (url, _):
        assert not any(folder.exists() for folder in left) and other.exists()
        assert httpx.get(f"{url}/stats", headers=KEY).json()["temporary_bytes"] == 0


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.parametrize(
    "body, path",
    [
        ({"query": "cell biology of cancer", "k": 100, "mode": "dense", "highlight": {"semantic": True}}, "/search"),
        (
            {
                "searches": [
                    {"query": f"protein {n} expression", "k": 100, "mode": "dense", "highlight": {"semantic": True}} for n in range(64)
                ]
            },
            "/search/batch",
        ),
    ],
    ids=["semantic highlights at the largest k", "a batch of 64 of them"],
)
def test_the_most_expensive_requests_stop_at_the_deadline_and_the_cores_idle_after(scifact_slice_index, body, path):
    with running_server(scifact_slice_index, {"HYBRID_REQUEST_TIMEOUT": "1"}) as (url, process):
        started = time.monotonic()
        response = httpx.post(f"{url}{path}", json=body, timeout=120)
        took = time.monotonic() - started
        time.sleep(0.3)  # a model batch in flight at the deadline finishes
        before = _cpu_seconds(process.pid)
        time.sleep(1.0)
        busy = _cpu_seconds(process.pid) - before
    assert response.status_code in (200, 504), response.text
    if response.status_code == 504:
        assert "deadline" in response.json()["detail"]
    assert took < 4.0, took
    assert busy < 0.2, f"{busy:.2f} s of CPU in the second after the answer"
