"""The client installs alone (clients/python) into a clean virtual environment: httpx and pydantic, none of the
server's libraries, and it imports and talks to nothing else of the package."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SERVER_ONLY = {"torch", "faiss-cpu", "faiss-gpu-cu12", "onnxruntime", "onnxruntime-gpu", "fastapi", "uvicorn", "numpy", "bm25s"}


@pytest.mark.slow
def test_the_client_installs_without_the_server(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    installed = subprocess.run([python, "-m", "pip", "install", "-q", str(ROOT / "clients" / "python")], capture_output=True, text=True)
    assert installed.returncode == 0, installed.stderr[-3000:]
    listed = subprocess.run([python, "-m", "pip", "list", "--format=freeze"], capture_output=True, text=True, check=True).stdout
    names = {line.split("==")[0].lower() for line in listed.splitlines()}
    assert {"hybrid-retrieval-client", "httpx", "pydantic"} <= names
    assert not names & SERVER_ONLY, names & SERVER_ONLY
    imports = "from hybrid_retrieval.client import Client, AsyncClient, SearchRequest; print(Client.__module__)"
    imported = subprocess.run([python, "-c", imports], capture_output=True, text=True, check=True)
    assert imported.stdout.strip() == "hybrid_retrieval.client.client"
    server = subprocess.run([python, "-c", "import hybrid_retrieval.app"], capture_output=True, text=True)
    assert server.returncode != 0 and "No module named 'hybrid_retrieval.app'" in server.stderr
