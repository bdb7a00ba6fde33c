"""The README's first hour, as a new user lives it: `bash scripts/run.sh` (installed already, never downloading)
serves, then the README's commands work as written, in order, from another shell: only the port differs, and curl
is told to fail on an HTTP error."""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from hybrid_retrieval.evaluation.server import free_port

pytestmark = pytest.mark.server  # each test talks to the service (a process, or create_app in this one)

ROOT = Path(__file__).resolve().parent.parent
BASH_BLOCK = re.compile(r"```bash\n(.*?)```", re.DOTALL)


def readme_commands(port: int) -> str:
    """The README's bash blocks after the first (which runs run.sh and test.sh themselves), as one script."""
    blocks = BASH_BLOCK.findall((ROOT / "README.md").read_text())
    assert len(blocks) >= 3 and "scripts/run.sh" in blocks[0]
    script = "\n".join(blocks[1:])
    return script.replace("localhost:8000", f"localhost:{port}").replace("curl -s ", "curl -sf ")


def serve_with_run_sh(tmp_path: Path, beir_data: Path, timeout_s: float):
    port = free_port()
    env = {
        **os.environ,
        "HYBRID_SKIP_SETUP": "1",
        "HYBRID_NO_DOWNLOAD": "1",
        "BEIR_DATA": str(beir_data),
        "HYBRID_INDEX": str(tmp_path / "index"),
        "HYBRID_DATA": str(tmp_path / "data"),
        "HYBRID_PORT": str(port),
    }
    log = (tmp_path / "run.log").open("w")
    process = subprocess.Popen(["bash", str(ROOT / "scripts" / "run.sh")], env=env, stdout=log, stderr=log, start_new_session=True)
    deadline = time.monotonic() + timeout_s
    while True:
        assert process.poll() is None, (tmp_path / "run.log").read_text()[-3000:]
        assert time.monotonic() < deadline, "run.sh did not serve in time"
        try:
            if httpx.get(f"http://127.0.0.1:{port}/ready", timeout=2).status_code == 200:
                return port, process
        except httpx.TransportError:
            pass
        time.sleep(0.5)


def stop(process: subprocess.Popen) -> None:
    os.killpg(process.pid, signal.SIGTERM)
    process.wait(timeout=60)


def run_readme(tmp_path: Path, port: int) -> list[dict]:
    """The README's commands from another shell in the folder holding data/ (as the checkout's root holds it); each
    curl's answer."""
    ran = subprocess.run(["bash", "-e", "-c", readme_commands(port)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr + ran.stdout
    return [json.loads(line) for line in ran.stdout.replace("}{", "}\n{").splitlines() if line.strip()]


def test_run_sh_serves_the_demo_corpus_offline_and_every_readme_command_works(tmp_path):
    port, process = serve_with_run_sh(tmp_path, tmp_path / "no-beir-here", timeout_s=600)
    try:
        log = (tmp_path / "run.log").read_text()
        assert "demo corpus" in log and "write key:" in log and "Traceback" not in log
        search, created, written, found = run_readme(tmp_path, port)
        assert search["hits"][0]["id"] == "vitamin-d-bone"  # the demo corpus answers the README's question
        assert created["name"] == "notes" and written["visible"] is True
        assert [hit["id"] for hit in found["hits"]] == ["n1"]
        stored = httpx.get(f"http://127.0.0.1:{port}/collections/notes/documents/n1", headers={"X-API-Key": key(tmp_path)})
        assert stored.json()["metadata"] == {"year": 2024}  # a top-level field is metadata, as in hybrid index
    finally:
        stop(process)
    # a second run starts in seconds, with the same key
    port, process = serve_with_run_sh(tmp_path, tmp_path / "no-beir-here", timeout_s=120)
    try:
        assert "indexing" not in (tmp_path / "run.log").read_text()
        assert httpx.get(f"http://127.0.0.1:{port}/collections/notes/stats", headers={"X-API-Key": key(tmp_path)}).status_code == 200
    finally:
        stop(process)


def key(tmp_path: Path) -> str:
    return (tmp_path / "data" / "write.key").read_text().strip()


@pytest.mark.slow
def test_run_sh_indexes_and_tunes_scifact_then_every_readme_command_works(tmp_path, scifact):
    """The scifact path, on its first 600 documents and the training queries judged inside them."""
    beir = tmp_path / "beir" / "scifact"
    (beir / "qrels").mkdir(parents=True)
    with (scifact / "corpus.jsonl").open() as fh:
        lines = list(itertools.islice(fh, 600))
    (beir / "corpus.jsonl").write_text("".join(lines))
    ids = {json.loads(line)["_id"] for line in lines}
    qrels = [row for row in (scifact / "qrels" / "train.tsv").read_text().splitlines()[1:] if row.split("\t")[1] in ids]
    (beir / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\n" + "\n".join(qrels) + "\n")
    (beir / "queries.jsonl").write_text((scifact / "queries.jsonl").read_text())
    port, process = serve_with_run_sh(tmp_path, tmp_path / "beir", timeout_s=1200)
    try:
        log = (tmp_path / "run.log").read_text()
        assert "indexing" in log and "tuning the fusion" in log and "demo corpus" not in log
        search, *_, found = run_readme(tmp_path, port)
        assert len(search["hits"]) == 5 and all(hit["id"] in ids for hit in search["hits"])
        assert [hit["id"] for hit in found["hits"]] == ["n1"]
    finally:
        stop(process)
