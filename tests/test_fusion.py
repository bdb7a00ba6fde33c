import numpy as np
import pytest

from hybrid_retrieval.common.errors import SpecError
from hybrid_retrieval.search.fusion import (
    DEFAULT_FUSION,
    RRF,
    Candidates,
    ConvexCombination,
    fuse,
    fusion_from_dict,
    fusion_from_string,
    fusion_to_dict,
    fusion_to_string,
)
from hybrid_retrieval.search.ranking import Ranking


def ranking(ids, scores=None):
    scores = scores if scores is not None else list(range(len(ids), 0, -1))
    return Ranking(np.array(ids, dtype=np.int64), np.array(scores, dtype=np.float32))


def rrf(rankings, rrf_k=60, weights=(1.0, 1.0)):
    """RRF of a BM25 and a dense list; RRF reads ranks only, so the raw scores are irrelevant here."""
    no_scores = {name: (lambda idx: np.zeros(len(idx))) for name in ("bm25", "dense")}
    fused = fuse(Candidates.from_rankings(dict(zip(("bm25", "dense"), rankings)), no_scores), RRF(rrf_k=rrf_k, weights=weights))
    return fused.ranking()


def test_rrf_by_hand():
    fused = rrf([ranking([7, 3, 5]), ranking([3, 9])], rrf_k=60)
    expected = {3: 1 / (60 + 2) + 1 / (60 + 1), 7: 1 / (60 + 1), 9: 1 / (60 + 2), 5: 1 / (60 + 3)}
    assert fused.doc_idx.tolist() == [3, 7, 9, 5]
    np.testing.assert_allclose(fused.scores, [expected[d] for d in fused.doc_idx], rtol=1e-12)


def test_rrf_ties_broken_by_doc_index():
    fused = rrf([ranking([4]), ranking([2])], rrf_k=60)
    assert fused.doc_idx.tolist() == [2, 4]


def test_weighted_rrf():
    fused = rrf([ranking([1, 2]), ranking([2, 1])], rrf_k=10, weights=(2.0, 1.0))
    assert fused.doc_idx.tolist() == [1, 2]
    np.testing.assert_allclose(fused.scores, [2 / 11 + 1 / 12, 2 / 12 + 1 / 11])


def test_rrf_of_empty_lists_is_empty():
    assert len(rrf([Ranking.empty(), Ranking.empty()])) == 0


def test_rrf_rejects_bad_weights():
    with pytest.raises(SpecError, match=r"weights: must be two numbers from 0 to 1e\+06 \[bm25, dense\]"):
        RRF(weights=(1.0,))
    with pytest.raises(SpecError, match="weights: must be between 0 and 1000000, got -1"):
        RRF(weights=(1.0, -1.0))
    with pytest.raises(SpecError, match="weights: must be between 0 and 1000000, got 1.7e308"):  # would overflow the sum
        RRF(rrf_k=0, weights=(1.7e308, 1.0))


@pytest.mark.slow  # ranx compiles its fusion with numba on first use: about 10 s
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


def candidates(bm25, dense, bm25_list, dense_list):
    """Candidates for docs 0..n-1 with full score vectors, ranked lists given explicitly."""
    return Candidates.from_rankings(
        {"bm25": ranking(bm25_list), "dense": ranking(dense_list)},
        {"bm25": lambda idx: np.asarray(bm25)[idx], "dense": lambda idx: np.asarray(dense)[idx]},
    )


def test_candidates_carry_both_scores_and_ranks():
    # doc 2 only in the BM25 list, doc 0 only in the dense list: both still get both raw scores.
    c = candidates(bm25=[1.0, 9.0, 5.0], dense=[0.8, 0.3, 0.1], bm25_list=[1, 2], dense_list=[0, 1])
    assert c.doc_idx.tolist() == [0, 1, 2]
    assert c.scores["bm25"].tolist() == [1.0, 9.0, 5.0] and c.scores["dense"].tolist() == [0.8, 0.3, 0.1]
    assert c.ranks["bm25"].tolist() == [0, 1, 2] and c.ranks["dense"].tolist() == [1, 2, 0]


def test_candidate_rrf_by_hand():
    c = candidates(bm25=[1.0, 9.0, 5.0], dense=[0.8, 0.3, 0.1], bm25_list=[1, 2], dense_list=[0, 1])
    fused = fuse(c, RRF(rrf_k=60, weights=(1.0, 2.0)))
    np.testing.assert_allclose(fused.scores, [2 / 61, 1 / 61 + 2 / 62, 1 / 62])
    assert fused.ranking().doc_idx.tolist() == [1, 0, 2]


def test_convex_combination_minmax_by_hand():
    c = candidates(bm25=[1.0, 9.0, 5.0], dense=[0.8, 0.3, 0.1], bm25_list=[1, 2], dense_list=[0, 1])
    fused = fuse(c, ConvexCombination(alpha=0.3, norm="minmax"))
    bm25_n = np.array([0.0, 1.0, (5 - 1) / (9 - 1)])
    dense_n = np.array([1.0, (0.3 - 0.1) / (0.8 - 0.1), 0.0])
    np.testing.assert_allclose(fused.scores, 0.3 * dense_n + 0.7 * bm25_n)
    np.testing.assert_allclose(fused.normalized["bm25"], bm25_n)
    np.testing.assert_allclose(fused.contributions["dense"] + fused.contributions["bm25"], fused.scores)


def test_the_default_fusion_is_equal_weight_z_scores_by_hand():
    c = candidates(bm25=[1.0, 9.0, 5.0], dense=[0.8, 0.3, 0.1], bm25_list=[1, 2], dense_list=[0, 1])
    assert DEFAULT_FUSION == ConvexCombination(alpha=0.5, norm="zscore") == fusion_from_dict({"method": "cc"})
    # bm25: mean 5, population std sqrt(32/3); dense: mean 0.4, std sqrt(0.26/3)
    bm25_z = np.array([-4.0, 4.0, 0.0]) / np.sqrt(32 / 3)
    dense_z = np.array([0.4, -0.1, -0.3]) / np.sqrt(0.26 / 3)
    fused = fuse(c, DEFAULT_FUSION)
    np.testing.assert_allclose(fused.scores, 0.5 * bm25_z + 0.5 * dense_z)
    assert fused.ranking().doc_idx.tolist() == [1, 0, 2]
    # the scale of either leg does not move the ranking: BM25 scores 100x larger rank the same
    scaled = candidates(bm25=[100.0, 900.0, 500.0], dense=[0.8, 0.3, 0.1], bm25_list=[1, 2], dense_list=[0, 1])
    np.testing.assert_allclose(fuse(scaled, DEFAULT_FUSION).scores, fused.scores)


def test_alpha_extremes_reproduce_single_retrievers():
    c = candidates(bm25=[1.0, 9.0, 5.0], dense=[0.8, 0.3, 0.1], bm25_list=[1, 2, 0], dense_list=[0, 1, 2])
    assert fuse(c, ConvexCombination(alpha=0.0, norm="zscore")).ranking().doc_idx.tolist() == [1, 2, 0]
    assert fuse(c, ConvexCombination(alpha=1.0, norm="zscore")).ranking().doc_idx.tolist() == [0, 1, 2]


def test_fusion_configs_validate_and_round_trip():
    for fusion in (RRF(rrf_k=10, weights=(0.5, 1.5)), ConvexCombination(alpha=0.25, norm="tmm")):
        assert fusion_from_dict(fusion_to_dict(fusion)) == fusion
    with pytest.raises(ValueError, match="valid: rrf, cc"):
        fusion_from_dict({"method": "borda"})
    with pytest.raises(SpecError, match="alpha: must be between 0 and 1, got 1.5"):
        ConvexCombination(alpha=1.5)
    with pytest.raises(SpecError, match="rrf_k: must be a finite number"):
        RRF(rrf_k=float("nan"))


def test_partial_fusion_merges_onto_the_same_method_only():
    base = ConvexCombination(alpha=0.45, norm="zscore")
    assert fusion_from_dict({"alpha": 0.3}, base) == ConvexCombination(alpha=0.3, norm="zscore")
    assert fusion_from_dict({"method": "cc"}, base) == base
    assert fusion_from_dict({"method": "rrf"}, base) == RRF()
    # no method: the one method whose fields were given, from its own defaults
    assert fusion_from_dict({"rrf_k": 30}, base) == RRF(rrf_k=30)
    assert fusion_from_dict({"alpha": 0.3}, RRF(rrf_k=5)) == ConvexCombination(alpha=0.3, norm="zscore")
    with pytest.raises(SpecError, match="alpha: not a field of rrf fusion; valid: rrf_k, weights") as err:
        fusion_from_dict({"method": "rrf", "alpha": 0.3}, base)
    assert err.value.field == "alpha"
    with pytest.raises(SpecError, match="not a field of cc fusion"):
        fusion_from_dict({"alpha": 0.3, "rrf_k": 5}, base)
    assert fusion_from_dict({"rrf_k": 30}) == RRF(rrf_k=30)  # no base: the fields name the method
    with pytest.raises(SpecError, match="unknown fusion method None"):
        fusion_from_dict({})


@pytest.mark.parametrize("fusion", [RRF(), RRF(rrf_k=2.5, weights=(0.25, 1.0)), ConvexCombination(alpha=0.05, norm="dbsf")])
def test_fusion_string_form_round_trips(fusion):
    assert fusion_from_dict(fusion_from_string(fusion_to_string(fusion))) == fusion


def _random_runs_over_same_docs(seed):
    rng = np.random.default_rng(seed)
    docs = rng.choice(1000, size=40, replace=False)
    return docs, rng.random(40) * 20, rng.random(40) * 2 - 1  # bm25-like and cosine-like scores


@pytest.mark.slow  # as above
@pytest.mark.parametrize("norm, ranx_norm", [("minmax", "min-max"), ("zscore", "zmuv")])
def test_convex_combination_matches_ranx_wsum(norm, ranx_norm):
    ranx = pytest.importorskip("ranx")
    alpha = 0.35
    bm25_runs, dense_runs, ours = {}, {}, {}
    for q in range(15):
        docs, bm25, dense = _random_runs_over_same_docs(q)
        bm25_runs[f"q{q}"] = {f"d{d}": float(s) for d, s in zip(docs, bm25)}
        dense_runs[f"q{q}"] = {f"d{d}": float(s) for d, s in zip(docs, dense)}
        full_bm25, full_dense = np.zeros(1000), np.zeros(1000)
        full_bm25[docs], full_dense[docs] = bm25, dense
        c = candidates(full_bm25, full_dense, docs[np.argsort(-bm25)], docs[np.argsort(-dense)])
        fused = fuse(c, ConvexCombination(alpha=alpha, norm=norm))
        ours[f"q{q}"] = {f"d{d}": s for d, s in zip(c.doc_idx, fused.scores)}
    theirs = ranx.fuse(
        [ranx.Run(bm25_runs), ranx.Run(dense_runs)], norm=ranx_norm, method="wsum", params={"weights": [1 - alpha, alpha]}
    ).to_dict()
    for q, scores in theirs.items():
        for doc, score in scores.items():
            assert ours[q][doc] == pytest.approx(score, abs=1e-6)
