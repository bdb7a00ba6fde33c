import json
import shutil
import subprocess
import sys

import pytest
from fastapi.testclient import TestClient

from hybrid_retrieval.app.main import create_app
from hybrid_retrieval.app.settings import Settings
from hybrid_retrieval.indexer.manifest import read_manifest
from hybrid_retrieval.indexer.store import open_index
from hybrid_retrieval.search.spec import HubnessSpec

pytestmark = pytest.mark.process  # the fixture fits with `hybrid hubness fit`


def hybrid(*args):
    return subprocess.run([sys.executable, "-m", "hybrid_retrieval.cli", *map(str, args)], capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def fitted_index(scifact, scifact_slice_index, tmp_path_factory):
    root = tmp_path_factory.mktemp("hubness")
    index_dir = root / "index"
    shutil.copytree(scifact_slice_index, index_dir)
    result = hybrid(
        "hubness",
        "fit",
        index_dir,
        "--bank",
        scifact / "queries.jsonl",
        "--split-qrels",
        scifact / "qrels" / "train.tsv",
        "--method",
        "qbnorm",
        "--dynamic",
        "--beta",
        "10",
        "--no-tune",
        "--set-default",
        "--force",
    )
    assert result.returncode == 0, result.stderr
    return index_dir


def test_fit_records_bank_params_and_checksummed_files(fitted_index):
    manifest = read_manifest(fitted_index)
    fitted = manifest.hubness
    assert manifest.defaults.hubness == HubnessSpec("qbnorm", True)
    assert fitted.params.beta == 10.0 and fitted.bank["size"] == 809 and fitted.bank["split"].endswith("train.tsv")
    assert f"{fitted.folder}/dense.faiss" in manifest.files and f"{fitted.folder}/qbnorm_query.npy" in manifest.files
    assert open_index(fitted_index, verify="full").hubness is not None


def test_refit_publishes_a_new_folder_and_removes_the_old(fitted_index, tmp_path):
    target = tmp_path / "index"
    shutil.copytree(fitted_index, target)
    before = read_manifest(target).hubness.folder
    result = hybrid("hubness", "fit", target, "--bank", "pseudo", "--pseudo-size", "50", "--method", "dbnorm")
    assert result.returncode == 0, result.stderr
    manifest = read_manifest(target)
    assert manifest.hubness.folder != before and not (target / before).exists()
    assert not any(f.startswith(f"{before}/") for f in manifest.files)
    # a refit without --set-default: the default earned with the old betas does not carry over
    assert manifest.defaults.hubness == HubnessSpec() and "hubness" not in manifest.evidence
    refused = hybrid("hubness", "fit", target, "--bank", "pseudo", "--pseudo-size", "50", "--method", "dbnorm", "--set-default")
    assert refused.returncode == 2 and "has no labels to show that dbnorm IS helps: nothing written" in refused.stderr
    assert read_manifest(target).to_dict() == manifest.to_dict()
    forced = hybrid("hubness", "fit", target, "--bank", "pseudo", "--pseudo-size", "50", "--method", "dbnorm", "--set-default", "--force")
    assert forced.returncode == 0, forced.stderr
    manifest = read_manifest(target)
    assert manifest.defaults.hubness == HubnessSpec("dbnorm", False)
    assert manifest.evidence["hubness"] == {
        "decision": "forced",
        "why": "unlabelled bank (pseudo-queries (document titles)): nothing to compare on",
    }
    assert open_index(target, verify="full").hubness is not None


def test_bank_refuses_test_queries_and_unrestricted_queries(scifact, fitted_index):
    refused = hybrid("hubness", "fit", fitted_index, "--bank", scifact / "queries.jsonl", "--split-qrels", scifact / "qrels" / "test.tsv")
    assert refused.returncode == 2 and "test queries must never enter a bank" in refused.stderr
    unrestricted = hybrid("hubness", "fit", fitted_index, "--bank", scifact / "queries.jsonl")
    assert unrestricted.returncode == 2 and "--split-qrels" in unrestricted.stderr


@pytest.mark.server
def test_service_applies_the_fitted_default_and_per_request_choice(fitted_index):
    with TestClient(create_app(Settings(index=fitted_index))) as client:
        default = client.post("/search", json={"query": "vitamin D deficiency", "mode": "dense", "k": 5}).json()
        assert default["spec"]["hubness"] == {"method": "qbnorm", "dynamic": True}
        ready = client.get("/ready").json()
        assert ready["defaults"]["hubness"] == {"method": "qbnorm", "dynamic": True}
        evidence = ready["evidence"]["hubness"]
        assert evidence == read_manifest(fitted_index).evidence["hubness"] and evidence["decision"] == "forced"
        assert set(evidence["values"]) == {"none", "qbnorm DIS"} and evidence["queries"] == 809
        raw = client.post(
            "/search", json={"query": "vitamin D deficiency", "mode": "dense", "k": 5, "hubness": {"method": "none", "dynamic": False}}
        ).json()
        assert raw["spec"]["hubness"]["method"] == "none" and all(-1 <= h["score"] <= 1 for h in raw["hits"])
        static = client.post(
            "/search",
            json={
                "query": "vitamin D deficiency",
                "mode": "hybrid",
                "k": 5,
                "hubness": {"method": "dbnorm", "dynamic": False},
                "explain": True,
            },
        ).json()
        assert static["spec"]["hubness"] == {"method": "dbnorm", "dynamic": False} and len(static["hits"]) == 5


@pytest.mark.server
def test_unfitted_index_rejects_hubness_with_422(scifact_slice_index):
    with TestClient(create_app(Settings(index=scifact_slice_index))) as client:
        response = client.post("/search", json={"query": "vitamin D", "hubness": {"method": "qbnorm"}})
        assert response.status_code == 422 and "hybrid hubness fit" in json.dumps(response.json())


def test_report_writes_table_histogram_and_json(scifact, fitted_index, tmp_path):
    result = hybrid(
        "hubness",
        "report",
        fitted_index,
        "--queries",
        scifact / "queries.jsonl",
        "--split-qrels",
        scifact / "qrels" / "test.tsv",
        "--out",
        tmp_path,
    )
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
    assert read_manifest(target).hubness.bank["kind"] == "pseudo-queries (document titles)"
