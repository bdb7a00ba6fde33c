"""The service needs no torch: the docker image ships ONNX Runtime only, so `hybrid serve` must start and answer
searches (dense leg included) in a process where importing torch or sentence-transformers fails."""

from __future__ import annotations

import subprocess
import sys

import httpx

from hybrid_retrieval.evaluation.server import free_port
from tests.conftest import wait_until_ready

SERVE_WITHOUT_TORCH = """
import runpy, sys
sys.modules["torch"] = None  # any import of them raises ImportError
sys.modules["sentence_transformers"] = None
sys.argv = ["hybrid", "--index", sys.argv[1], "--port", sys.argv[2], "--host", "127.0.0.1"]
runpy.run_module("hybrid_retrieval.app", run_name="__main__")
"""


def test_the_service_starts_and_searches_without_torch(tiny_index):
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-c", SERVE_WITHOUT_TORCH, str(tiny_index), str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            wait_until_ready(client, server, 120)
            for mode in ("dense", "hybrid"):
                response = client.post("/search", json={"query": "a kitten resting on a rug", "k": 3, "mode": mode})
                assert response.status_code == 200, response.text
                assert response.json()["hits"][0]["id"] == "d1", (mode, response.text)
    finally:
        server.terminate()
        server.wait(timeout=30)
