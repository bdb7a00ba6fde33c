"""The documented multi-node commands: a Ray head and a worker node on loopback (scripts/ray_cluster.sh), a sharded
index served through them by `hybrid serve --ray ADDRESS`, answering like the whole index."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from hybrid_retrieval.evaluation.server import free_port
from hybrid_retrieval.indexer.shards.split import split_index
from hybrid_retrieval.indexer.store import open_index
from tests.conftest import REPO, sample_queries, wait_until_ready

pytest.importorskip("ray", reason="Ray is not installed (pip install 'hybrid-retrieval[ray]')")
pytestmark = [pytest.mark.ray, pytest.mark.slow]  # two Ray nodes and a Serve deployment: about 40 s


def test_serve_through_a_head_and_a_worker_node(whole_index, scifact, tmp_path):
    sharded = tmp_path / "sharded"
    split_index(whole_index, sharded, 2)
    ray_port, http_port = free_port(), free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "RAY_AUTH_MODE": "token"}
    cluster = ["bash", str(REPO / "scripts" / "ray_cluster.sh")]
    subprocess.run([*cluster, "start", str(ray_port)], check=True, cwd=REPO, env=env, capture_output=True)
    server = None
    try:
        deadline = time.monotonic() + 60
        while True:  # the status lags a node's registration by a few seconds
            status = subprocess.run(
                [str(REPO / ".venv" / "bin" / "ray"), "status", "--address", f"127.0.0.1:{ray_port}"],
                cwd=REPO,
                env=env,
                capture_output=True,
                text=True,
            ).stdout
            if status.count(" node_") == 2 or time.monotonic() > deadline:
                break
            time.sleep(2)
        assert status.count(" node_") == 2, status  # the head and the worker
        server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "hybrid_retrieval.cli",
                "serve",
                "--ray",
                f"127.0.0.1:{ray_port}",
                "--index",
                str(sharded),
                "--port",
                str(http_port),
                "--replicas",
                "2",
            ],
            cwd=REPO,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        with httpx.Client(base_url=f"http://127.0.0.1:{http_port}", timeout=30) as client:
            wait_until_ready(client, server, 180, pause_s=1)
            whole = open_index(whole_index)
            for query in sample_queries(scifact, 3, 120):
                hits = client.post("/search", json={"query": query, "k": 10, "mode": "hybrid"}).json()["hits"]
                expected = whole.pipeline().search(query, 10, {"mode": "hybrid"})
                assert [hit["id"] for hit in hits] == [whole.doc_ids[i] for i in expected.ranking.doc_idx]
        server.send_signal(signal.SIGTERM)
        assert server.wait(60) == 0
    finally:
        if server is not None and server.poll() is None:
            server.kill()
        subprocess.run([*cluster, "stop"], cwd=REPO, env=env, capture_output=True)
