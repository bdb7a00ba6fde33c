"""The compose deployment, for real: scripts/docker_smoke.sh builds the images, brings the stack up
over a scifact slice and queries it on loopback (`pytest -m docker`; needs root or a running engine)."""

import json
import os
import shutil
import subprocess

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.docker


def test_compose_stack_indexes_serves_and_skips_an_unchanged_corpus(scifact, tmp_path):
    engine_up = shutil.which("docker") and subprocess.run(["docker", "info"], capture_output=True).returncode == 0
    if not engine_up and os.geteuid() != 0:
        pytest.skip("no Docker engine running, and installing one needs root")
    report = tmp_path / "report.json"
    env = {**os.environ, "BEIR_DATA": str(scifact.parent), "SMOKE_REPORT": str(report)}
    result = subprocess.run(["bash", str(REPO / "scripts" / "docker_smoke.sh")], env=env, timeout=3000)
    assert result.returncode == 0
    summary = json.loads(report.read_text())
    assert summary["ready"]["documents"] == 300
    assert summary["hit_at_10"] >= 0.8
    assert {"hybrid-retrieval:api-cpu", "hybrid-retrieval:indexer-cpu"} <= summary["images"].keys()
