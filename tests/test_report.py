import numpy as np
import pytest

from hybrid_retrieval.evaluation.report import compare_to_baseline, markdown_table, write_trec_run
from hybrid_retrieval.quality.significance import randomization_test


def test_identical_systems_are_not_different():
    a = np.array([0.2, 0.5, 0.9])
    assert randomization_test(a, a) == 1.0


def test_p_value_of_a_tiny_case_by_enumeration():
    # Differences (1, 1, 1): of the 2^3 sign patterns only all-plus and all-minus reach |mean| = 1, so p = 2/8.
    p = randomization_test(np.array([1.0, 1.0, 1.0]), np.zeros(3), trials=200_000, seed=1)
    assert p == pytest.approx(2 / 8, abs=0.01)


def test_consistent_improvement_is_significant():
    rng = np.random.default_rng(0)
    base = rng.random(300)
    assert randomization_test(base + 0.05, base) < 0.001


def test_trec_run_file_ranks_by_score(tmp_path):
    write_trec_run({"q1": {"a": 0.2, "b": 0.9}}, tmp_path / "r.trec", "tag")
    assert (tmp_path / "r.trec").read_text() == "q1 Q0 b 1 0.900000 tag\nq1 Q0 a 2 0.200000 tag\n"


def test_comparison_and_markdown_marks():
    per_query = {
        "bm25": {"ndcg@10": {f"q{i}": 0.5 for i in range(50)}},
        "better": {"ndcg@10": {f"q{i}": 0.9 for i in range(50)}},
    }
    comparison = compare_to_baseline(per_query, "bm25")
    assert comparison["better"]["wins"] == 50 and comparison["better"]["p_value"] < 0.05
    assert comparison["bm25"] == {"p_value": 1.0, "wins": 0, "ties": 50, "losses": 0}
    report = {"dataset": "d", "split": "test", "queries": 50, "pipelines": {"bm25": {"ndcg@10": 0.5}, "better": {"ndcg@10": 0.9}}}
    table = markdown_table(report, comparison, "bm25")
    assert "| better† | 0.9000 |" in table and "| bm25 | 0.5000 |" in table


def test_reranked_pipelines_are_compared_with_their_own_first_stage():
    from hybrid_retrieval.evaluation.report import first_stage_table
    from hybrid_retrieval.evaluation.runner import parse_pipeline
    from hybrid_retrieval.evaluation.suite import first_stage_comparisons

    assert parse_pipeline("hybrid+rerank:w=0.5@int8").first_stage == "hybrid"
    assert parse_pipeline("dense+rerank+qbnorm").first_stage == parse_pipeline("dense+qbnorm+rerank").first_stage == "dense+qbnorm"
    qids = [f"q{i}" for i in range(10)]
    base = {q: 0.5 for q in qids}
    per_query = {
        "hybrid": {"ndcg@10": base},
        "hybrid+rerank": {"ndcg@10": {**base, "q0": 0.9, "q1": 0.9, "q2": 0.3}},  # +0.4 +0.4 -0.2 over 10 queries
        "dense+rerank": {"ndcg@10": base},
    }  # no `dense` evaluated: nothing to compare with
    compared = first_stage_comparisons(per_query)
    assert set(compared) == {"hybrid+rerank"}
    vs = compared["hybrid+rerank"]
    assert vs["first_stage"] == "hybrid" and vs["ndcg@10_delta"] == pytest.approx((0.4 + 0.4 - 0.2) / 10)
    assert (vs["wins"], vs["ties"], vs["losses"]) == (2, 7, 1) and 0 < vs["p_value"] <= 1
    assert (
        first_stage_table({"hybrid": {}, "hybrid+rerank": {"vs_first_stage": {**vs, "p_value": 0.37}}})[-1]
        == "| hybrid+rerank | hybrid | +0.0600 | 2/7/1 | 0.37 |"
    )
    assert first_stage_table({"hybrid": {"ndcg@10": 0.7}}) == []
