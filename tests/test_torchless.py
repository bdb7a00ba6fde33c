"""The service needs no torch: the docker image ships ONNX Runtime only, so `hybrid serve` must start and answer
searches (dense leg included) in a process where importing torch or sentence-transformers fails."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from hybrid_retrieval.evaluation.server import free_port
from tests.conftest import wait_until_ready

pytestmark = pytest.mark.server  # each test talks to the service (a process, or create_app in this one)

SERVE_WITHOUT_TORCH = """
import runpy, sys

sys.modules["torch"] = None  # any import of them raises ImportError
sys.modules["sentence_transformers"] = None
sys.argv = ["hybrid", "--index", sys.argv[1], "--data", sys.argv[3], "--port", sys.argv[2], "--host", "127.0.0.1"]
runpy.run_module("hybrid_retrieval.app", run_name="__main__")
"""


@contextlib.contextmanager
def served_without_torch(index: Path, tmp_path: Path, **env: str) -> Iterator[httpx.Client]:
    """A client of `hybrid serve` over `index`, run where importing torch fails and nothing was exported before."""
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-c", SERVE_WITHOUT_TORCH, str(index), str(port), str(tmp_path / "data")],
        env={**os.environ, "HYBRID_CACHE": str(tmp_path / "no-exports"), **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            wait_until_ready(client, server, 120)
            yield client
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_the_service_starts_searches_and_creates_collections_without_torch(tiny_index, tmp_path):
    with served_without_torch(tiny_index, tmp_path, HYBRID_WRITE_KEYS="w") as client:
        headers = {"X-API-Key": "w"}
        for mode in ("dense", "hybrid"):
            response = client.post("/search", json={"query": "a kitten resting on a rug", "k": 3, "mode": mode}, headers=headers)
            assert response.status_code == 200, response.text
            assert response.json()["hits"][0]["id"] == "d1", (mode, response.text)
        # a new collection of the served index's model takes that model's files: no export, no torch
        created = client.post("/collections", json={"name": "notes"}, headers=headers)
        assert created.status_code == 201, created.text
        note = {"id": "n1", "text": "A kitten sleeps on a warm rug."}
        assert client.put("/collections/notes/documents?wait=true", json={"documents": [note]}, headers=headers).status_code == 200
        found = client.post("/collections/notes/search", json={"query": "cat napping", "mode": "dense"}, headers=headers)
        assert found.json()["hits"][0]["id"] == "n1", found.text
