"""SIGKILL a real server while a client writes: no acknowledged write is lost, no batch is half applied."""

from __future__ import annotations

import random
import shutil
import threading
import time

import httpx
import pytest

from hybrid_retrieval.evaluation.server import running_server
from tests.conftest import TINY_CORPUS

ROUNDS = 20
KEY = {"X-API-Key": "crash-writer"}
ENV = {"HYBRID_WRITE_KEYS": "crash-writer", "HYBRID_REFRESH_INTERVAL": "0.1", "HYBRID_VERIFY": "size"}


def batch(round_no: int, n: int) -> list[dict]:
    marker = f"zqx{round_no}q{n}"  # one token shared by the batch's documents and no other
    return [{"id": f"r{round_no}-{n}-{j}", "text": f"{marker} document {j} of batch {n}"} for j in range(3)]


def write_until_killed(url: str, round_no: int, acknowledged: dict, sent: list, errors: list) -> None:
    with httpx.Client(base_url=url, timeout=30, headers=KEY) as client:
        for n in range(10_000):
            documents = batch(round_no, n)
            sent.append(documents)
            try:
                response = client.put("/documents", json={"documents": documents})
            except httpx.TransportError:
                return  # killed mid-request: this batch may or may not have been logged
            if response.status_code != 200:
                errors.append(response.text)
                return
            acknowledged[(round_no, n)] = [d["id"] for d in documents]


def check(url: str, acknowledged: dict, sent: list) -> None:
    with httpx.Client(base_url=url, timeout=30, headers=KEY) as client:
        for documents in sent:
            ids = [d["id"] for d in documents]
            present = [client.get(f"/documents/{doc_id}").status_code == 200 for doc_id in ids]
            round_no, n, _ = ids[0].split("-")
            if (int(round_no[1:]), int(n)) in acknowledged:
                assert all(present), f"acknowledged batch {ids} lost"
                found = client.post("/search", json={"query": documents[0]["text"].split()[0], "mode": "bm25", "k": 10})
                assert sorted(h["id"] for h in found.json()["hits"]) == sorted(ids)
            else:
                assert not any(present) or all(present), f"batch {ids} half applied: {present}"


@pytest.mark.crash
def test_acknowledged_writes_survive_sigkill(tiny_index, tmp_path):
    index_dir = tmp_path / "index"
    shutil.copytree(tiny_index, index_dir)
    rng = random.Random(7)
    acknowledged: dict = {}
    sent: list = []
    errors: list = []
    for round_no in range(ROUNDS):
        with running_server(index_dir, ENV) as (url, process):
            check(url, acknowledged, sent)
            writer = threading.Thread(target=write_until_killed, args=(url, round_no, acknowledged, sent, errors))
            writer.start()
            time.sleep(rng.uniform(0.2, 1.5))
            process.kill()  # SIGKILL: no shutdown hooks, no flush
            process.wait()
            writer.join()
            assert not errors, errors
    with running_server(index_dir, ENV) as (url, _):
        check(url, acknowledged, sent)
        stats = httpx.get(f"{url}/stats", headers=KEY).json()
    assert len(acknowledged) >= ROUNDS  # writes were acknowledged in (nearly) every round
    # background compactions ran along the way (past 1,000 written documents), killed or not: the counts still add up
    assert stats["documents"] >= len(TINY_CORPUS) + 3 * len(acknowledged)
