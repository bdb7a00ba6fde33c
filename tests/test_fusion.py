import numpy as np
import pytest

from search.fusion import rrf
from search.ranking import Ranking


def ranking(ids, scores=None):
    scores = scores if scores is not None else list(range(len(ids), 0, -1))
    return Ranking(np.array(ids, dtype=np.int64), np.array(scores, dtype=np.float32))


def test_rrf_by_hand():
    fused = rrf([ranking([7, 3, 5]), ranking([3, 9])], rrf_k=60)
    expected = {3: 1 / (60 + 2) + 1 / (60 + 1), 7: 1 / (60 + 1), 9: 1 / (60 + 2), 5: 1 / (60 + 3)}
    assert fused.doc_idx.tolist() == [3, 7, 9, 5]
    np.testing.assert_allclose(fused.scores, [expected[d] for d in fused.doc_idx], rtol=1e-12)


def test_rrf_ties_broken_by_doc_index():
    fused = rrf([ranking([4]), ranking([2])], rrf_k=60)
    assert fused.doc_idx.tolist() == [2, 4]


def test_weighted_rrf():
    fused = rrf([ranking([1, 2]), ranking([2, 1])], rrf_k=10, weights=[2.0, 1.0])
    assert fused.doc_idx.tolist() == [1, 2]
    np.testing.assert_allclose(fused.scores, [2 / 11 + 1 / 12, 2 / 12 + 1 / 11])


def test_rrf_of_empty_lists_is_empty():
    assert len(rrf([Ranking.empty(), Ranking.empty()])) == 0


def test_rrf_rejects_mismatched_weights():
    with pytest.raises(ValueError, match="2 weights for 1 rankings"):
        rrf([ranking([1])], weights=[1, 1])


def test_rrf_matches_ranx_on_random_runs():
    ranx = pytest.importorskip("ranx")
    rng = np.random.default_rng(7)
    runs = []
    for _ in range(2):
        run = {}
        for q in range(20):
            docs = rng.choice(200, size=50, replace=False)
            run[f"q{q}"] = {f"d{d}": float(s) for d, s in zip(docs, rng.random(50))}
        runs.append(run)
    fused_ranx = ranx.fuse([ranx.Run(r) for r in runs], method="rrf", params={"k": 60}).to_dict()
    for q in runs[0]:
        ours = rrf([_as_ranking(run[q]) for run in runs], rrf_k=60)
        ours_scores = {f"d{d}": s for d, s in zip(ours.doc_idx, ours.scores)}
        assert set(ours_scores) == set(fused_ranx[q])
        for doc, score in fused_ranx[q].items():
            assert ours_scores[doc] == pytest.approx(score, abs=1e-9)


def _as_ranking(scores: dict) -> Ranking:
    items = sorted(scores.items(), key=lambda kv: -kv[1])
    return ranking([int(d[1:]) for d, _ in items], [s for _, s in items])
