import math

import numpy as np
import pytest

from hybrid_retrieval.quality.metrics import evaluate


def test_ndcg_recall_mrr_by_hand():
    qrels = {"q1": {"a": 1, "c": 1}, "q2": {"x": 1}}
    run = {"q1": {"a": 3.0, "b": 2.0, "c": 1.0}, "q2": {"y": 1.0}}
    metrics = evaluate(run, qrels)
    ideal = 1 + 1 / math.log2(3)
    assert metrics["ndcg@10"] == pytest.approx(((1 + 1 / math.log2(4)) / ideal + 0) / 2)
    assert metrics["recall@100"] == pytest.approx((1 + 0) / 2)
    assert metrics["mrr@10"] == pytest.approx((1 + 0) / 2)
    assert metrics["map@100"] == pytest.approx(((1 + 2 / 3) / 2 + 0) / 2)


def test_query_missing_from_run_counts_as_zero():
    assert evaluate({}, {"q1": {"a": 1}})["ndcg@10"] == 0.0


@pytest.mark.slow  # ranx compiles its metrics with numba on first use: about 10 s
def test_agrees_with_ranx_on_random_runs():
    ranx = pytest.importorskip("ranx")
    rng = np.random.default_rng(3)
    qrels = {f"q{i}": {f"d{d}": 1 for d in rng.choice(50, 3, replace=False)} for i in range(30)}
    run = {q: {f"d{d}": float(s) for d, s in zip(rng.choice(50, 40, replace=False), rng.random(40))} for q in qrels}
    ours = evaluate(run, qrels)
    theirs = ranx.evaluate(ranx.Qrels(qrels), ranx.Run(run), ["ndcg@10", "recall@100", "mrr@10", "map@100"])
    for metric, value in theirs.items():
        assert ours[metric] == pytest.approx(value, abs=1e-4)
