import json
import shutil
import subprocess
import sys

import pytest

from evaluation.runner import RerankChoice, doc_ids, parse_pipeline
from evaluation.tuning import ALPHAS, RRF_KS, tune
from indexer.corpus import read_corpus, split_queries
from indexer.store import open_index
from search.fusion import RRF, ConvexCombination
from search.normalize import NORMALIZERS
from search.pipeline import HubnessChoice


@pytest.fixture(scope="module")
def train_split(scifact, scifact_slice):
    """Training queries whose judged documents are in the slice (a small, honest tuning set)."""
    ids = {d.doc_id for d in read_corpus(scifact_slice)}
    queries, qrels = split_queries(scifact, "train")
    keep = [q for q, rel in qrels.items() if set(rel) <= ids][:25]
    return {q: queries[q] for q in keep}, {q: qrels[q] for q in keep}


def test_tune_sweeps_every_configuration_and_picks_the_best(scifact_slice_index, train_split):
    queries, qrels = train_split
    index = open_index(scifact_slice_index)
    result = tune(index.pipeline(), doc_ids(index), queries, qrels, progress=False)
    assert len(result.table) == len(ALPHAS) * len(NORMALIZERS) + len(RRF_KS)
    best = max(row["ndcg@10"] for row in result.table)
    assert result.best()["ndcg@10"] == best
    assert isinstance(result.best_fusion(), (RRF, ConvexCombination))
    assert set(result.singles) == {"bm25", "dense"} and all(0 < v <= 1 for v in result.singles.values())


def test_tune_command_writes_default_fusion_and_refuses_test_split(scifact, scifact_slice_index, train_split, tmp_path):
    index_dir = tmp_path / "index"
    shutil.copytree(scifact_slice_index, index_dir)
    queries, qrels = train_split
    (tmp_path / "queries.jsonl").write_text("".join(json.dumps({"_id": q, "text": t}) + "\n" for q, t in queries.items()))
    (tmp_path / "train.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{d}\t{r}\n" for q, rel in qrels.items() for d, r in rel.items()))
    cmd = [sys.executable, "-m", "app.cli", "tune", str(index_dir), "--queries", str(tmp_path / "queries.jsonl"), "--quiet"]

    refused = subprocess.run(cmd + ["--qrels", str(scifact / "qrels" / "test.tsv")], capture_output=True, text=True)
    assert refused.returncode == 2 and "refusing to tune" in refused.stderr

    done = subprocess.run(cmd + ["--qrels", str(tmp_path / "train.tsv")], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    manifest = json.loads((index_dir / "manifest.json").read_text())
    table = json.loads((index_dir / "tuning" / "fusion.json").read_text())["table"]
    best = max(table, key=lambda row: row["ndcg@10"])
    assert manifest["fusion"]["tuning"]["value"] == round(best["ndcg@10"], 4)
    assert manifest["fusion"]["default"]["method"] == best["method"]
    assert (index_dir / "tuning" / "fusion.png").read_bytes()[:4] == b"\x89PNG"
    # The service and CLI now fuse with the tuned default.
    assert open_index(index_dir).pipeline().fusion == parse_pipeline(
        "rrf:%g" % best["rrf_k"] if best["method"] == "rrf" else f"cc:{best['norm']}:{best['alpha']}")[1]


def test_pipeline_specs():
    none = HubnessChoice()
    assert parse_pipeline("bm25") == ("bm25", None, none, None)
    assert parse_pipeline("rrf:10") == ("hybrid", RRF(rrf_k=10.0), none, None)
    assert parse_pipeline("cc:zscore:0.4") == ("hybrid", ConvexCombination(alpha=0.4, norm="zscore"), none, None)
    assert parse_pipeline("dense+qbnorm:dis") == ("dense", None, HubnessChoice("qbnorm", True), None)
    assert parse_pipeline("hybrid+rerank") == ("hybrid", None, none, RerankChoice("fp32", None))
    assert parse_pipeline("bm25+rerank:int8") == ("bm25", None, none, RerankChoice("int8", None))
    assert parse_pipeline("hybrid+rerank:int8:w=0.35")[3] == RerankChoice("int8", 0.35)
    assert parse_pipeline("hybrid+rerank:w=1")[3] == RerankChoice("fp32", 1.0)
    for bad in ("hybrid+rerank:w=1.5", "hybrid+rerank:w=x", "hybrid+rerank:fp16", "hybrid+rerank:w=0.2:w=0.3", "hybrid+rerank:w=nan"):
        with pytest.raises(ValueError, match=r"valid: rerank\[:fp32\|int8\]\[:w=WEIGHT\]"):
            parse_pipeline(bad)
    with pytest.raises(ValueError, match="valid: qbnorm, dbnorm"):
        parse_pipeline("dense+csls")
    with pytest.raises(ValueError, match="valid: bm25, dense, hybrid"):
        parse_pipeline("cc:zscore")
    with pytest.raises(ValueError, match="alpha must be between 0 and 1"):
        parse_pipeline("cc:minmax:3")


def _slice_dataset(scifact, scifact_slice, root):
    """The scifact slice as a BEIR folder, with train and test queries judged inside the slice only."""
    from indexer.corpus import read_qrels, read_queries

    ids = {d.doc_id for d in read_corpus(scifact_slice)}
    folder = root / "scifact-slice"
    (folder / "qrels").mkdir(parents=True)
    shutil.copy(scifact_slice, folder / "corpus.jsonl")
    queries = read_queries(scifact / "queries.jsonl")
    kept = set()
    for split in ("train", "test"):
        rows = [(q, d, r) for q, rel in read_qrels(scifact / "qrels" / f"{split}.tsv").items() if set(rel) <= ids for d, r in rel.items()]
        rows = [row for row in rows if row[0] in {q for q, _, _ in rows[:60]}]
        kept |= {q for q, _, _ in rows}
        (folder / "qrels" / f"{split}.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{d}\t{r}\n" for q, d, r in rows))
    (folder / "queries.jsonl").write_text("".join(json.dumps({"_id": q, "text": queries[q]}) + "\n" for q in sorted(kept)))
    return folder


def test_eval_tunes_on_train_reports_and_caches(scifact, scifact_slice, scifact_slice_index, tmp_path):
    from evaluation.suite import EvalConfig, evaluate_dataset

    dataset = _slice_dataset(scifact, scifact_slice, tmp_path)
    index_dir = tmp_path / "index"
    shutil.copytree(scifact_slice_index, index_dir)
    config = EvalConfig(pipelines=("bm25", "dense", "hybrid"), progress=False)
    report = evaluate_dataset(dataset, index_dir, config, tmp_path / "out")
    assert report["tuned_on"] == "train"
    assert json.loads((index_dir / "manifest.json").read_text())["fusion"]["tuning"]["qrels"].endswith("train.tsv")
    assert {p.name for p in (tmp_path / "out").iterdir()} >= {"report.json", "report.md", "ndcg.png", "win_loss.png", "runs", "cache"}
    assert sorted(p.name for p in (tmp_path / "out" / "runs").iterdir()) == ["bm25.trec", "dense.trec", "hybrid.trec"]
    cached = sorted((tmp_path / "out" / "cache").iterdir())
    assert len(cached) == 3
    again = evaluate_dataset(dataset, index_dir, config, tmp_path / "out")  # served from the cache
    assert again["pipelines"] == report["pipelines"] and sorted((tmp_path / "out" / "cache").iterdir()) == cached


def test_metrics_from_trec_run_files_agree_with_ranx(scifact, scifact_slice, scifact_slice_index, tmp_path):
    ranx = pytest.importorskip("ranx")
    from evaluation.suite import EvalConfig, evaluate_dataset

    dataset = _slice_dataset(scifact, scifact_slice, tmp_path)
    report = evaluate_dataset(dataset, scifact_slice_index, EvalConfig(pipelines=("bm25", "hybrid"), tune=False, progress=False), tmp_path / "out")
    qrels = ranx.Qrels(split_queries(dataset, "test")[1])
    for name in ("bm25", "hybrid"):
        run = ranx.Run.from_file(str(tmp_path / "out" / "runs" / f"{name}.trec"), kind="trec")
        theirs = ranx.evaluate(qrels, run, ["ndcg@10", "recall@100", "mrr@10", "map@100"])
        for metric, value in theirs.items():
            assert report["pipelines"][name][metric] == pytest.approx(value, abs=1e-4)
