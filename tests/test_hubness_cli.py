import json
import shutil
import subprocess
import sys

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings
from indexer.store import open_index


def hybrid(*args):
    return subprocess.run([sys.executable, "-m", "app.cli", *map(str, args)], capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def fitted_index(scifact, scifact_slice_index, tmp_path_factory):
    root = tmp_path_factory.mktemp("hubness")
    index_dir = root / "index"
    shutil.copytree(scifact_slice_index, index_dir)
    result = hybrid("hubness", "fit", index_dir, "--bank", scifact / "queries.jsonl", "--split-qrels", scifact / "qrels" / "train.tsv",
                    "--method", "qbnorm", "--dynamic", "--beta", "10")
    assert result.returncode == 0, result.stderr
    return index_dir


def test_fit_records_bank_params_and_checksummed_files(fitted_index):
    manifest = json.loads((fitted_index / "manifest.json").read_text())
    spec = manifest["hubness"]
    assert spec["default"] == {"method": "qbnorm", "dynamic": True}
    assert spec["params"]["beta"] == 10.0 and spec["bank"]["size"] == 809 and spec["bank"]["split"].endswith("train.tsv")
    assert "hubness/dense.faiss" in manifest["files"] and "hubness/qbnorm_query.npy" in manifest["files"]
    assert open_index(fitted_index, verify="full").hubness is not None


def test_bank_refuses_test_queries_and_unrestricted_queries(scifact, fitted_index):
    refused = hybrid("hubness", "fit", fitted_index, "--bank", scifact / "queries.jsonl", "--split-qrels", scifact / "qrels" / "test.tsv")
    assert refused.returncode == 2 and "test queries must never enter a bank" in refused.stderr
    unrestricted = hybrid("hubness", "fit", fitted_index, "--bank", scifact / "queries.jsonl")
    assert unrestricted.returncode == 2 and "--split-qrels" in unrestricted.stderr


def test_service_applies_the_fitted_default_and_per_request_choice(fitted_index):
    with TestClient(create_app(Settings(index=fitted_index))) as client:
        default = client.post("/search", json={"query": "vitamin D deficiency", "mode": "dense", "k": 5}).json()
        assert default["hubness"] == {"method": "qbnorm", "dynamic": True}
        raw = client.post("/search", json={"query": "vitamin D deficiency", "mode": "dense", "k": 5, "hubness": "none"}).json()
        assert raw["hubness"]["method"] == "none" and all(-1 <= h["score"] <= 1 for h in raw["hits"])
        static = client.post("/search", json={"query": "vitamin D deficiency", "mode": "hybrid", "k": 5,
                                              "hubness": "dbnorm", "dynamic": False, "explain": True}).json()
        assert static["hubness"] == {"method": "dbnorm", "dynamic": False} and len(static["hits"]) == 5


def test_unfitted_index_rejects_hubness_with_422(scifact_slice_index):
    with TestClient(create_app(Settings(index=scifact_slice_index))) as client:
        response = client.post("/search", json={"query": "vitamin D", "hubness": "qbnorm"})
        assert response.status_code == 422 and "hybrid hubness fit" in json.dumps(response.json())


def test_report_writes_table_histogram_and_json(scifact, fitted_index, tmp_path):
    result = hybrid("hubness", "report", fitted_index, "--queries", scifact / "queries.jsonl", "--split-qrels",
                    scifact / "qrels" / "test.tsv", "--out", tmp_path)
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert set(report["variants"]) == {"none", "qbnorm IS", "qbnorm DIS", "dbnorm IS", "dbnorm DIS"}
    assert (tmp_path / "k_occurrence.png").read_bytes()[:4] == b"\x89PNG"
    assert "skewness" in result.stdout


def test_pseudo_query_bank_is_labelled(fitted_index, tmp_path):
    target = tmp_path / "index"
    shutil.copytree(fitted_index, target)
    result = hybrid("hubness", "fit", target, "--bank", "pseudo", "--pseudo-size", "200")
    assert result.returncode == 0, result.stderr
    assert json.loads((target / "manifest.json").read_text())["hubness"]["bank"]["kind"] == "pseudo-queries (document titles)"
