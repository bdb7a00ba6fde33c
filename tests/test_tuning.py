import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

from hybrid_retrieval.common.errors import SpecError
from hybrid_retrieval.evaluation.runner import Pipeline, parse_pipeline
from hybrid_retrieval.indexer.corpus import read_corpus, split_queries
from hybrid_retrieval.indexer.manifest import read_manifest
from hybrid_retrieval.indexer.store import open_index
from hybrid_retrieval.search.fusion import DEFAULT_FUSION, RRF, ConvexCombination, fusion_from_dict, fusion_to_dict
from hybrid_retrieval.search.normalize import NORMALIZERS
from hybrid_retrieval.search.spec import SearchSpec
from hybrid_retrieval.training.fusion import ALPHAS, RRF_KS, TuningResult, evidence, tune_fusion


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
    result = tune_fusion(index.pipeline(), index.doc_ids, queries, qrels, progress=False)
    assert len(result.table) == len(ALPHAS) * len(NORMALIZERS) + len(RRF_KS)
    best = max(row["ndcg@10"] for row in result.table)
    assert result.best()["ndcg@10"] == best
    assert isinstance(result.best_fusion(), (RRF, ConvexCombination))
    assert set(result.singles) == {"bm25", "dense"} and all(0 < v <= 1 for v in result.singles.values())


@pytest.mark.process
def test_tune_command_writes_default_fusion_and_refuses_test_split(scifact, scifact_slice_index, train_split, tmp_path):
    index_dir = tmp_path / "index"
    shutil.copytree(scifact_slice_index, index_dir)
    queries, qrels = train_split
    (tmp_path / "queries.jsonl").write_text("".join(json.dumps({"_id": q, "text": t}) + "\n" for q, t in queries.items()))
    (tmp_path / "train.tsv").write_text(
        "query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{d}\t{r}\n" for q, rel in qrels.items() for d, r in rel.items())
    )
    cmd = [sys.executable, "-m", "hybrid_retrieval.cli", "tune", str(index_dir), "--queries", str(tmp_path / "queries.jsonl"), "--quiet"]

    refused = subprocess.run(cmd + ["--qrels", str(scifact / "qrels" / "test.tsv")], capture_output=True, text=True)
    assert refused.returncode == 2 and "test queries must never choose parameters" in refused.stderr

    done = subprocess.run(cmd + ["--qrels", str(tmp_path / "train.tsv")], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    manifest = read_manifest(index_dir)
    table = json.loads((index_dir / "tuning" / "fusion.json").read_text())["table"]
    best = max(table, key=lambda row: row["ndcg@10"])
    evidence = manifest.evidence["fusion"]
    assert evidence["queries"] == len(queries) and evidence["folds"] == 5 and evidence["split"].endswith("train.tsv")
    before, after = evidence["values"]["untuned cc:zscore:0.5"], evidence["values"]["tuned, cross-validated"]
    tuned = fusion_from_dict({k: v for k, v in best.items() if k != "ndcg@10"})
    won = after > before and evidence["p"] < 0.05
    # the figure shown beside the served default is its own: never the in-sample best of a sweep it may have rejected
    assert manifest.fusion_tuning.value == round(after if won else before, 4)
    assert manifest.fusion_tuning.best_in_sample == round(best["ndcg@10"], 4) and manifest.fusion_tuning.decision == evidence["decision"]
    assert manifest.defaults.fusion == (tuned if won else DEFAULT_FUSION)
    assert evidence["decision"] == ("tuned" if won else "kept untuned")
    assert "before/after on held-out queries" in done.stdout and f"decision: {evidence['decision']}" in done.stdout
    assert (index_dir / "tuning" / "fusion.png").read_bytes()[:4] == b"\x89PNG"
    # The service and CLI now fuse with the tuned default.
    assert open_index(index_dir).pipeline().defaults.fusion == manifest.defaults.fusion


def _result(per_query: list[dict[str, float]]) -> TuningResult:
    fusions = [DEFAULT_FUSION, ConvexCombination(alpha=0.3), RRF()][: len(per_query)]
    table = [{**fusion_to_dict(f), "ndcg@10": sum(v.values()) / len(v)} for f, v in zip(fusions, per_query)]
    return TuningResult("ndcg@10", len(per_query[0]), table, {}, per_query)


def test_cross_validation_chooses_on_other_folds_and_scores_the_held_out_one():
    rng = np.random.default_rng(0)
    qids = [f"q{i}" for i in range(23)]
    per_query = [dict(zip(qids, rng.random(23).round(2))) for _ in range(3)]
    result = _result(per_query)
    # brute force, the same folds: permutation of the sorted query ids, modulo 5
    fold = np.random.default_rng(0).permutation(23) % 5
    ordered = sorted(qids)
    expected = 0.0
    for f in range(5):
        train = [q for q, g in zip(ordered, fold) if g != f]
        held = [q for q, g in zip(ordered, fold) if g == f]
        chosen = max(range(3), key=lambda c: (np.mean([per_query[c][q] for q in train]), -c))
        expected += sum(per_query[chosen][q] for q in held)
    assert result.cross_validated() == pytest.approx(expected / 23)


def test_tuning_keeps_the_untuned_default_unless_it_wins_out_of_sample(tmp_path):
    qids = [f"q{i}" for i in range(10)]
    # cc alpha 0.3 is better on every query: tuned wins out of sample too
    wins = _result([{q: 0.5 for q in qids}, {q: 0.6 for q in qids}])
    proof = evidence(wins, tmp_path / "train.tsv")
    assert proof["decision"] == "tuned" and proof["values"]["untuned cc:zscore:0.5"] == 0.5
    assert proof["values"]["tuned, cross-validated"] == pytest.approx(0.6)
    # a configuration lucky on half the queries: best in-sample, but choosing by it does not beat the default held out
    lucky = _result([{q: 0.5 for q in qids}, {q: (0.9 if i % 2 else 0.15) for i, q in enumerate(qids)}])
    assert lucky.best_fusion() == ConvexCombination(alpha=0.3)
    proof = evidence(lucky, tmp_path / "train.tsv")
    assert proof["values"]["tuned, cross-validated"] <= 0.5 and proof["decision"] == "kept untuned"
    # a tie keeps the untuned default
    assert evidence(_result([{q: 0.5 for q in qids}] * 2), tmp_path / "train.tsv")["decision"] == "kept untuned"
    # a gain out of sample that is not significant keeps it too: better on 2 queries of 10, equal on the rest
    small = _result([{q: 0.5 for q in qids}, {q: (0.6 if i < 2 else 0.5) for i, q in enumerate(qids)}])
    proof = evidence(small, tmp_path / "train.tsv")
    assert proof["values"]["tuned, cross-validated"] > 0.5 and proof["p"] >= 0.05 and proof["decision"] == "kept untuned"
    # the test, by hand: 2 non-zero differences of +0.1; of their 4 sign patterns, 2 (both alike) are as extreme
    assert proof["p"] == pytest.approx(0.5, abs=0.02)


def test_pipeline_specs():
    assert parse_pipeline("bm25") == Pipeline("bm25", {"mode": "bm25"})
    assert parse_pipeline("rrf:10").spec == {"mode": "hybrid", "fusion": {"method": "rrf", "rrf_k": 10.0}}
    assert parse_pipeline("cc:zscore:0.4").spec == {"mode": "hybrid", "fusion": {"method": "cc", "norm": "zscore", "alpha": 0.4}}
    assert parse_pipeline("dense+qbnorm:dis").spec == {"mode": "dense", "hubness": {"method": "qbnorm", "dynamic": True}}
    hybrid_rerank = parse_pipeline("hybrid+rerank")
    assert hybrid_rerank.spec == {"mode": "hybrid", "rerank": {"enabled": True}} and hybrid_rerank.first_stage == "hybrid"
    assert parse_pipeline("bm25+rerank@int8") == Pipeline("bm25+rerank@int8", {"mode": "bm25", "rerank": {"enabled": True}}, "int8")
    assert parse_pipeline("hybrid+qbnorm+rerank:w=0.35@int8").first_stage == "hybrid+qbnorm"
    assert parse_pipeline("hybrid+rerank:w=1").spec["rerank"] == {"enabled": True, "weight": 1.0}
    assert parse_pipeline("hybrid").first_stage is None
    for bad, field in [
        ("hybrid+rerank:w=x", "rerank.weight"),
        ("hybrid+rerank:fp16", "rerank"),
        ("dense+csls", "spec"),
        ("cx:zscore", "mode"),
        ("hybrid+rerank@fp16", "precision"),
        ("hybrid@int8", "precision"),
        ("hybrid+depth:1.5x", "depth"),
    ]:
        with pytest.raises(SpecError) as err:
            parse_pipeline(bad)
        assert err.value.field == field, bad
    # values are checked where the spec is built: the error names the field
    for bad, field in [
        ("hybrid+rerank:w=1.5", "rerank.weight"),
        ("cc:minmax:3", "fusion.alpha"),
        ("hybrid+rerank:w=nan", "rerank.weight"),
        ("hybrid+depth:0", "depth"),
        ("rrf:-1", "fusion.rrf_k"),
    ]:
        with pytest.raises(SpecError) as err:
            SearchSpec.from_dict(parse_pipeline(bad).spec)
        assert err.value.field == field, bad


def _slice_dataset(scifact, scifact_slice, root):
    """The scifact slice as a BEIR folder, with train and test queries judged inside the slice only."""
    from hybrid_retrieval.indexer.corpus import read_qrels, read_queries

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
    from hybrid_retrieval.evaluation.suite import EvalConfig, evaluate_dataset

    dataset = _slice_dataset(scifact, scifact_slice, tmp_path)
    index_dir = tmp_path / "index"
    shutil.copytree(scifact_slice_index, index_dir)
    config = EvalConfig(pipelines=("bm25", "dense", "hybrid"), progress=False)
    report = evaluate_dataset(dataset, index_dir, config, tmp_path / "out")
    assert report["tuned_on"] == "train"
    assert read_manifest(index_dir).fusion_tuning.qrels.endswith("train.tsv")
    assert {p.name for p in (tmp_path / "out").iterdir()} >= {"report.json", "report.md", "ndcg.png", "win_loss.png", "runs", "cache"}
    assert sorted(p.name for p in (tmp_path / "out" / "runs").iterdir()) == ["bm25.trec", "dense.trec", "hybrid.trec"]
    cached = sorted((tmp_path / "out" / "cache").iterdir())
    assert len(cached) == 3
    again = evaluate_dataset(dataset, index_dir, config, tmp_path / "out")  # served from the cache
    assert again["pipelines"] == report["pipelines"] and sorted((tmp_path / "out" / "cache").iterdir()) == cached


@pytest.mark.slow  # ranx compiles its metrics with numba on first use: about 10 s
def test_metrics_from_trec_run_files_agree_with_ranx(scifact, scifact_slice, scifact_slice_index, tmp_path):
    ranx = pytest.importorskip("ranx")
    from hybrid_retrieval.evaluation.suite import EvalConfig, evaluate_dataset

    dataset = _slice_dataset(scifact, scifact_slice, tmp_path)
    report = evaluate_dataset(
        dataset, scifact_slice_index, EvalConfig(pipelines=("bm25", "hybrid"), tune=False, progress=False), tmp_path / "out"
    )
    qrels = ranx.Qrels(split_queries(dataset, "test")[1])
    for name in ("bm25", "hybrid"):
        run = ranx.Run.from_file(str(tmp_path / "out" / "runs" / f"{name}.trec"), kind="trec")
        theirs = ranx.evaluate(qrels, run, ["ndcg@10", "recall@100", "mrr@10", "map@100"])
        for metric, value in theirs.items():
            assert report["pipelines"][name][metric] == pytest.approx(value, abs=1e-4)


@pytest.mark.server
def test_eval_rows_are_what_the_service_serves(scifact, scifact_slice, scifact_slice_index, tmp_path):
    """`hybrid eval`'s pipelines merge onto the index's defaults exactly as a request does: `hybrid` scores
    the same as POST /search with nothing but the query, over HTTP."""
    from hybrid_retrieval.evaluation.served import served_quality
    from hybrid_retrieval.evaluation.suite import EvalConfig, evaluate_dataset

    dataset = _slice_dataset(scifact, scifact_slice, tmp_path)
    report = evaluate_dataset(dataset, scifact_slice_index, EvalConfig(pipelines=("hybrid",), tune=False, progress=False))
    served = served_quality(scifact_slice_index, dataset)
    assert served["queries"] == report["queries"] and served["defaults"] == report["specs"]["hybrid"]
    for metric in ("ndcg@10", "recall@100", "mrr@10", "map@100"):
        assert served[metric] == pytest.approx(report["pipelines"]["hybrid"][metric], abs=1e-4)


def test_the_fusion_an_index_served_before_is_shown_beside_the_default(tmp_path):
    qids = [f"q{i}" for i in range(10)]
    result = _result([{q: 0.5 for q in qids}, {q: 0.6 for q in qids}, {q: 0.4 for q in qids}])  # default, cc 0.3, RRF
    proof = evidence(result, tmp_path / "train.tsv", served=RRF())
    assert proof["values"]["served before: rrf:60"] == pytest.approx(0.4) and proof["values"]["untuned cc:zscore:0.5"] == 0.5
    assert "served before: cc:zscore:0.5" not in evidence(result, tmp_path / "train.tsv", served=DEFAULT_FUSION)["values"]
