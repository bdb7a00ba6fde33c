import json
import subprocess
import sys

import pytest

from hybrid_retrieval.evaluation.server import free_port
from hybrid_retrieval.training.reranker import WEIGHT_GRID
from tests.conftest import TINY_CORPUS, write_jsonl


def hybrid(*args):
    return subprocess.run([sys.executable, "-m", "hybrid_retrieval.cli", *map(str, args)], capture_output=True, text=True, timeout=300)


@pytest.mark.process
def test_search_command_prints_json(tiny_index):
    result = hybrid("search", tiny_index, "cat on a mat", "--mode", "bm25", "--k", "2", "--json")
    assert result.returncode == 0, result.stderr
    body = json.loads(result.stdout)
    assert body["hits"][0]["id"] == "d1" and len(body["hits"]) == 2


@pytest.mark.process
def test_index_command_reports_bad_corpus_line(tmp_path):
    bad = write_jsonl(tmp_path / "bad.jsonl", [TINY_CORPUS[0], {"_id": "z"}])
    result = hybrid("index", bad, "--out", tmp_path / "idx", "--quiet")
    assert result.returncode == 2
    assert "bad.jsonl:2: missing field 'text'" in result.stderr
    assert not (tmp_path / "idx").exists()


@pytest.mark.server
def test_serve_refuses_a_damaged_data_directory_fast(tmp_path):
    (tmp_path / "aliases.json").write_text("{not json")
    result = hybrid("serve", "--data", tmp_path, "--port", free_port())
    assert result.returncode == 2 and "aliases.json is not valid JSON" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.server
def test_serve_refuses_a_corrupted_index_with_a_clear_message(tiny_index, tmp_path):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(tiny_index, broken)
    data = bytearray((broken / "docs.jsonl").read_bytes())
    data[5] ^= 0x01
    (broken / "docs.jsonl").write_bytes(bytes(data))
    result = hybrid("serve", "--index", broken, "--port", free_port())
    assert result.returncode == 2 and result.stderr.startswith("error: index file ")
    assert "docs.jsonl does not match its checksum in the manifest (corrupted)" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.server
def test_serve_reports_invalid_settings_in_one_line(tiny_index, monkeypatch):
    monkeypatch.setenv("HYBRID_RERANK_WEIGHT", "1.5")
    result = hybrid("serve", "--index", tiny_index, "--port", free_port())
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "error: invalid settings: " in result.stderr and "rerank.weight: must be between 0 and 1, got 1.5" in result.stderr


def reranker_data(folder):
    """Three judged queries on the tiny corpus, and the same judgements as a train and a test split."""
    queries = write_jsonl(
        folder / "queries.jsonl",
        [{"_id": "q1", "text": "cat on a mat"}, {"_id": "q2", "text": "stock markets"}, {"_id": "q3", "text": "pet dog"}],
    )
    (folder / "qrels").mkdir()
    for split in ("train", "test"):
        (folder / "qrels" / f"{split}.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td4\t1\nq3\td6\t1\n")
    return queries


@pytest.mark.training
def test_train_reranker_refuses_test_qrels_and_layers_the_model_lacks(tiny_index, tmp_path):
    queries = reranker_data(tmp_path)
    refused = hybrid(
        "train-reranker", tiny_index, "--queries", queries, "--qrels", tmp_path / "qrels" / "test.tsv", "--out", tmp_path / "rr"
    )
    assert refused.returncode == 2 and "refusing" in refused.stderr and "test queries must never" in refused.stderr
    assert not (tmp_path / "rr").exists()
    for layers, message in ((0, "layers must be >= 1"), (7, "--layers 7: the base model has 6 layers")):
        refused = hybrid(
            "train-reranker",
            tiny_index,
            "--queries",
            queries,
            "--qrels",
            tmp_path / "qrels" / "train.tsv",
            "--out",
            tmp_path / "rr",
            "--layers",
            layers,
            "--quiet",
            "--device",
            "cpu",
        )
        assert refused.returncode == 2 and message in refused.stderr, refused.stderr
    assert not (tmp_path / "rr").exists()


@pytest.mark.slow  # three trainings and their ONNX exports: about 30 s
def test_train_reranker_writes_a_servable_model_and_distils_a_student(tiny_index, tmp_path):
    queries = reranker_data(tmp_path)
    out = tmp_path / "rr"
    result = hybrid(
        "train-reranker",
        tiny_index,
        "--queries",
        queries,
        "--qrels",
        tmp_path / "qrels" / "train.tsv",
        "--out",
        out,
        "--max-length",
        32,
        "--negatives",
        2,
        "--mine-depth",
        4,
        "--quiet",
        "--device",
        "cpu",
        "--layers",
        2,
    )
    assert result.returncode == 0, result.stderr
    record = json.loads((out / "training.json").read_text())
    assert record["options"]["layers"] == 2 and json.loads((out / "config.json").read_text())["num_hidden_layers"] == 2
    from bench.compute_floor import graph_flops

    assert graph_flops(out / "onnx" / "model.onnx").attention_matmuls == 2 * 2  # the served graph has 2 layers
    # 3 judged queries: 1 held out for tuning, 2 groups of 1 + 2 negatives per epoch, 2 epochs of one step
    assert record["data"]["dev_queries"] == 1 and record["data"]["groups_per_epoch"] == 2
    assert record["data"]["pairs"] == 2 * 2 * 3 and record["steps"] == 2
    assert record["interpolation"]["weight"] in WEIGHT_GRID and record["interpolation"]["dev"]["queries"] == 1
    assert {"model.onnx", "model.int8.onnx", "cross_encoder.json", "tokenizer.json"} <= {p.name for p in (out / "onnx").iterdir()}

    from hybrid_retrieval.models.cross_encoder import OnnxCrossEncoder, load_cross_encoder, tuned_weight

    assert tuned_weight(out) == tuned_weight(out / "onnx") == record["interpolation"]["weight"]

    onnx = load_cross_encoder(out, device="cpu")
    assert isinstance(onnx, OnnxCrossEncoder) and onnx.max_length == 32
    texts = [d["title"] + " " + d["text"] for d in TINY_CORPUS]
    torch_scores = load_cross_encoder(out, backend="torch", device="cpu").score("cat on a mat", texts)
    assert abs(onnx.score("cat on a mat", texts) - torch_scores).max() < 2e-3

    searched = hybrid("search", tiny_index, "cat on a mat", "--reranker", out, "--k", "3", "--json", "--device", "cpu")
    assert searched.returncode == 0, searched.stderr
    body = json.loads(searched.stdout)
    assert "rerank" in body["timings_ms"]
    assert body["spec"]["rerank"] == {"enabled": True, "depth": 50, "weight": record["interpolation"]["weight"]}

    student = tmp_path / "student"
    result = hybrid(
        "train-reranker",
        tiny_index,
        "--queries",
        queries,
        "--qrels",
        tmp_path / "qrels" / "train.tsv",
        "--out",
        student,
        "--max-length",
        32,
        "--negatives",
        2,
        "--mine-depth",
        4,
        "--quiet",
        "--device",
        "cpu",
        "--layers",
        1,
        "--teacher",
        out,
    )
    assert result.returncode == 0, result.stderr
    distilled = json.loads((student / "training.json").read_text())
    assert distilled["options"]["teacher"] == str(out) and distilled["loss"]["first_10pct"] > 0
    assert distilled["base_model"]["name"] == str(out)  # a student starts from its teacher's own weights

    onnx_only = hybrid(
        "train-reranker",
        tiny_index,
        "--queries",
        queries,
        "--qrels",
        tmp_path / "qrels" / "train.tsv",
        "--out",
        tmp_path / "student2",
        "--quiet",
        "--device",
        "cpu",
        "--layers",
        1,
        "--teacher",
        out / "onnx",
    )
    assert onnx_only.returncode != 0 and "pass --base-model" in onnx_only.stderr


def test_index_skip_if_current_rebuilds_only_when_the_corpus_changed(tmp_path, capsys):
    from hybrid_retrieval.cli import main

    corpus, out = write_jsonl(tmp_path / "corpus.jsonl", TINY_CORPUS), tmp_path / "index"
    index = ["index", str(corpus), "--out", str(out), "--skip-if-current", "--quiet"]
    assert main(index) == 0 and "indexed 6 documents" in capsys.readouterr().out
    built = (out / "manifest.json").stat()
    assert main(index) == 0 and "build skipped" in capsys.readouterr().out
    assert (out / "manifest.json").stat().st_ino == built.st_ino

    write_jsonl(corpus, TINY_CORPUS[:3])
    assert main(index) == 0 and "indexed 3 documents" in capsys.readouterr().out


def test_index_into_a_collection_keeps_the_services_naming_rules(tmp_path, capsys):
    from hybrid_retrieval.cli import main
    from hybrid_retrieval.indexer.datadir.layout import DataDir

    corpus, data = write_jsonl(tmp_path / "corpus.jsonl", TINY_CORPUS), tmp_path / "data"
    index = ["index", str(corpus), "--data", str(data), "--quiet", "--collection"]
    assert main([*index, "notes"]) == 0 and (data / "collections" / "notes" / "manifest.json").is_file()
    DataDir(data).set_alias("latest", "notes")
    capsys.readouterr()
    refusals = {
        "notes": f"collection 'notes' exists in {data}: pass --replace",
        "latest": f"'latest' is an alias in {data}: collections and aliases share names",
        "Not a name!": "--collection",
    }
    for name, error in refusals.items():
        assert main([*index, name]) == 2 and error in capsys.readouterr().err
    assert main([*index, "notes", "--replace", "--shards", "2"]) == 2 and "are not sharded" in capsys.readouterr().err
    assert main([*index, "notes", "--replace"]) == 0 and "indexed 6 documents" in capsys.readouterr().out


@pytest.mark.process
def test_search_command_takes_a_spec_string(tiny_index):
    result = hybrid("search", tiny_index, "cat on a mat", "--spec", "hybrid+cc:zscore:0.3+depth:4", "--k", "3", "--json")
    assert result.returncode == 0, result.stderr
    spec = json.loads(result.stdout)["spec"]
    assert spec["fusion"] == {"method": "cc", "alpha": 0.3, "norm": "zscore"} and spec["depth"] == 4


@pytest.mark.process
def test_command_errors_are_one_line_with_exit_code_2(tiny_index, tmp_path):
    corpus = write_jsonl(tmp_path / "corpus.jsonl", TINY_CORPUS)
    (tmp_path / "photos").mkdir()
    (tmp_path / "photos" / "cat.jpg").write_bytes(b"not an index")
    for args, message in [
        (("search", tiny_index, "cat", "--spec", "hybrid+rerank:w=2"), "error: rerank.weight: must be between 0 and 1, got 2"),
        (("search", tiny_index, "cat", "--spec", "hybrid+qbnorm"), "error: hubness.method: this index has no fitted hubness correction"),
        (("search", tiny_index, "cat", "--rerank-weight", "0.5"), "error: --rerank-weight needs --reranker"),
        (("search", tiny_index / "missing", "cat"), "is not an index: no manifest.json"),
        (("index", corpus, "--out", tmp_path / "photos", "--quiet"), "photos exists and is not an index: refusing to replace it"),
    ]:
        result = hybrid(*args)
        assert result.returncode == 2, (args, result.stderr)
        assert message in result.stderr and "Traceback" not in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert (tmp_path / "photos" / "cat.jpg").read_bytes() == b"not an index"


@pytest.mark.process
def test_ingest_writes_the_log_that_search_and_the_service_read(tiny_index, tmp_path):
    import shutil

    shutil.copytree(tiny_index, tmp_path / "index")
    docs = write_jsonl(tmp_path / "docs.jsonl", [{"_id": "n1", "text": "an axolotl regrows its limbs"}, {"_id": "d1", "text": "replaced"}])
    (tmp_path / "ids.txt").write_text("d2\n")
    result = hybrid("ingest", tmp_path / "index", docs, "--delete", tmp_path / "ids.txt")
    assert result.returncode == 0, result.stderr
    assert "2 documents upserted, 1 ids deleted" in result.stdout and "sequence 2" in result.stdout
    found = json.loads(hybrid("search", tmp_path / "index", "axolotl limbs", "--mode", "bm25", "--json").stdout)
    assert [h["id"] for h in found["hits"]] == ["n1"]
    dogs = json.loads(hybrid("search", tmp_path / "index", "dogs chase the mailman", "--mode", "bm25", "--json").stdout)
    assert "d2" not in [h["id"] for h in dogs["hits"]]
    nothing = hybrid("ingest", tmp_path / "index")
    assert nothing.returncode == 2 and "nothing to do" in nothing.stderr


@pytest.mark.process
def test_the_cli_imports_without_the_dev_dependencies():
    """The docker image installs no dev extras: `hybrid` must start without httpx, ranx or pytest."""
    code = "import sys\nfor name in ('httpx', 'ranx', 'pytest', 'hypothesis'): sys.modules[name] = None\nimport hybrid_retrieval.cli"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


@pytest.mark.process
def test_every_long_step_of_a_build_shows_its_progress_with_a_total(tmp_path):
    corpus = write_jsonl(tmp_path / "corpus.jsonl", TINY_CORPUS)
    result = hybrid("index", corpus, "--out", tmp_path / "index")
    assert result.returncode == 0, result.stderr
    bars = result.stderr.replace("\r", "\n")
    n = len(TINY_CORPUS)
    # each bar ends at its total, so it could tell the time left all along: documents, embeddings, the vector index
    for step, unit in (("documents", "docs"), ("embeddings", "docs"), ("vector index", "vectors")):
        assert f"{step}: 100%" in bars and f"{n}/{n}" in bars and f" {unit}/s]" in bars, step
    assert "documents:" not in hybrid("index", corpus, "--out", tmp_path / "quiet", "--quiet").stderr  # --quiet: no bars
