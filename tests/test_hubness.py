import numpy as np
import pytest

from hybrid_retrieval.indexer.hubness import fit_correction, sample_gallery
from hybrid_retrieval.search.dense import DenseIndex, FaissParams, build_faiss_index
from hybrid_retrieval.search.hubness import (
    HubnessParams,
    HubnessSearcher,
    augment_documents,
    bank_statistics,
    hubness_stats,
    k_occurrence,
)
from hybrid_retrieval.search.ranking import Ranking
from hybrid_retrieval.search.spec import HubnessSpec
from hybrid_retrieval.training.hubness import CrossFit, DefaultRefused, _default_evidence


def unit(x):
    x = np.asarray(x, dtype=np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def brute_force_scores(queries, docs, bank, gallery_idx, params, method, dynamic):
    """The papers' formulas on the full similarity matrices, in float64, with no shortcut."""
    S = queries.astype(np.float64) @ docs.T.astype(np.float64)
    SB = bank.astype(np.float64) @ docs.T.astype(np.float64)
    SG = docs[gallery_idx].astype(np.float64) @ docs.T.astype(np.float64)
    SG[np.arange(len(gallery_idx)), gallery_idx] = -np.inf  # a document is always its own neighbour
    active_B = set(np.argsort(-SB, axis=1)[:, : params.k].ravel())
    active_G = set(np.argsort(-SG, axis=1)[:, : params.k].ravel())
    out = np.empty_like(S)
    for i, s in enumerate(S):
        top1 = int(np.argmax(s))
        use_B = not dynamic or top1 in active_B
        use_G = not dynamic or top1 in active_G
        if method == "qbnorm":
            is_b = np.exp(params.beta * s) / np.exp(params.beta * SB).sum(axis=0)
            out[i] = is_b if use_B else s
        else:
            f_b = np.exp(params.beta1 * s) / np.exp(params.beta1 * SB).sum(axis=0)
            f_g = np.exp(params.beta2 * s) / np.exp(params.beta2 * SG).sum(axis=0)
            out[i] = (f_b if use_B else 1.0) * (f_g if use_G else 1.0) if (use_B or use_G) else s
    return out


def our_rankings(queries, docs, bank, params, method, dynamic, depth, gallery_size):
    gallery = sample_gallery(len(docs), gallery_size, seed=0)
    correction, _ = fit_correction(bank, docs[gallery], gallery, docs, params)
    flat = FaissParams()
    searcher = HubnessSearcher(correction, DenseIndex(build_faiss_index(augment_documents(docs, correction), flat, "cpu"), flat, "cpu"))
    rankings = [searcher.search(q, depth, method, dynamic)[0] for q in queries]
    return rankings, gallery, correction


CASES = [("qbnorm", False), ("qbnorm", True), ("dbnorm", False), ("dbnorm", True)]


@pytest.mark.parametrize("method, dynamic", CASES)
def test_corrected_top100_equals_brute_force_on_random_data(method, dynamic):
    rng = np.random.default_rng(11)
    centre = rng.standard_normal(24)
    docs = unit(rng.standard_normal((600, 24)) + 0.8 * centre)  # a shared direction creates hubs
    bank = unit(rng.standard_normal((150, 24)) + 0.8 * centre)
    queries = unit(rng.standard_normal((25, 24)) + 0.8 * centre)
    params = HubnessParams(beta=20.0, beta1=1 / 1.99, beta2=3.0, k=1)
    rankings, gallery, _ = our_rankings(queries, docs, bank, params, method, dynamic, depth=100, gallery_size=200)
    expected = brute_force_scores(queries, docs, bank, gallery, params, method, dynamic)
    assert_same_ranking(rankings, expected)


def assert_same_ranking(rankings, expected, depth=100):
    """Our top-depth is the brute-force top-depth up to float32 near-ties (equal expected scores)."""
    for ranking, row in zip(rankings, expected):
        theirs = np.argsort(-row, kind="stable")[:depth]
        assert len(ranking) == depth
        np.testing.assert_allclose(row[ranking.doc_idx], row[theirs], rtol=1e-5, atol=1e-9)
        assert len(set(ranking.doc_idx.tolist()) ^ set(theirs.tolist())) <= 2  # only a tie at the cut may differ


@pytest.mark.parametrize("method, dynamic", CASES)
def test_corrected_top100_equals_brute_force_on_scifact(scifact_slice_index, scifact, method, dynamic):
    from hybrid_retrieval.indexer.corpus import split_queries
    from hybrid_retrieval.indexer.store import open_index

    index = open_index(scifact_slice_index)
    docs = np.asarray(index.embeddings)
    texts = list(split_queries(scifact, "train")[0].values())
    bank, queries = index.embedder.encode(texts[:120]), index.embedder.encode(texts[120:140])
    params = HubnessParams(beta=10.0, beta1=2.0, beta2=5.0, k=2)
    rankings, gallery, _ = our_rankings(queries, docs, bank, params, method, dynamic, depth=100, gallery_size=300)
    expected = brute_force_scores(queries, docs, bank, gallery, params, method, dynamic)
    assert_same_ranking(rankings, expected)


def test_chunked_statistics_equal_one_shot_logsumexp():
    rng = np.random.default_rng(5)
    docs, bank = unit(rng.standard_normal((700, 16))), unit(rng.standard_normal((300, 16)))
    fit = bank_statistics(bank, docs, beta=7.0, k=2, bank_chunk=64, doc_chunk=128)
    lse, activation = fit.lse, fit.activation
    logits = 7.0 * (bank.astype(np.float64) @ docs.T)
    expected = logits.max(axis=0) + np.log(np.exp(logits - logits.max(axis=0)).sum(axis=0))
    np.testing.assert_allclose(lse, expected, rtol=1e-6)
    expected_active = np.zeros(700, dtype=bool)
    expected_active[np.argsort(-(bank @ docs.T), axis=1)[:, :2].ravel()] = True
    np.testing.assert_array_equal(activation, expected_active)


def test_large_beta_does_not_overflow():
    rng = np.random.default_rng(2)
    docs, bank = unit(rng.standard_normal((50, 8))), unit(rng.standard_normal((40, 8)))
    assert np.all(np.isfinite(bank_statistics(bank, docs, beta=2000.0).lse))


def test_k_occurrence_and_skewness_by_hand():
    rankings = [Ranking(np.array([0, 1]), np.array([1.0, 0.5])), Ranking(np.array([0, 2]), np.array([1.0, 0.5]))]
    counts = k_occurrence(rankings, num_docs=4, k=2)
    assert counts.tolist() == [2, 1, 1, 0]
    mean, std = 1.0, np.sqrt(0.5)
    expected_skew = (((np.array([2, 1, 1, 0]) - mean) ** 3).mean()) / std**3
    stats = hubness_stats(counts)
    assert stats["skewness"] == pytest.approx(expected_skew, abs=1e-4)
    assert stats["never_retrieved"] == 0.25 and stats["max_occurrence"] == 2


def test_invalid_parameters():
    with pytest.raises(ValueError, match="beta: must be > 0, got 0"):
        HubnessParams(beta=0)
    with pytest.raises(ValueError, match="k: must be >= 1"):
        HubnessParams(k=0)


def _synthetic(with_hubs: bool, n_queries=120, n_docs=400, dim=32, seed=3):
    """Queries sharing a common direction, each with one relevant document close to it. With hubs: 20
    documents near the queries' centroid, irrelevant to every query, that crowd the raw top 10."""
    rng = np.random.default_rng(seed)

    def unit(x):
        return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)

    common = unit(rng.standard_normal(dim))
    queries = unit(common + 0.5 * unit(rng.standard_normal((n_queries, dim))))
    relevant = unit(queries + 0.9 * unit(rng.standard_normal((n_queries, dim))))
    others = unit(rng.standard_normal((n_docs - n_queries - 20, dim)))
    hubs = unit(queries.mean(axis=0) + 0.05 * rng.standard_normal((20, dim))) if with_hubs else unit(rng.standard_normal((20, dim)))
    docs = np.vstack([relevant, hubs, others])
    ids = [f"d{i}" for i in range(len(docs))]
    qids = [f"q{i}" for i in range(n_queries)]
    qrels = {q: {f"d{i}": 1} for i, q in enumerate(qids)}
    return queries, qids, qrels, docs, ids


@pytest.mark.parametrize("with_hubs", [True, False])
def test_default_is_enabled_only_where_the_correction_wins_on_held_out_queries(with_hubs):
    queries, qids, qrels, docs, ids = _synthetic(with_hubs)
    cross_fit = CrossFit(queries, qids, qrels, docs, ids, gallery=np.arange(50))
    candidate, params = HubnessSpec("qbnorm"), HubnessParams(beta=20.0)
    raw = cross_fit.score(params, "none", False)
    corrected = cross_fit.score(params, "qbnorm", False)
    info = {"kind": "queries", "split": "train.tsv"}
    if with_hubs:  # the hubs take the raw top ranks; QB-Norm pushes them down and the relevant documents up
        assert raw < 0.05 and corrected > raw + 0.3
        evidence = _default_evidence(cross_fit, candidate, params, info, force=False)
        assert evidence["decision"] == "enabled" and evidence["values"] == {"none": raw, "qbnorm IS": corrected}
        assert evidence["queries"] == len(qids) and evidence["folds"] == 5 and evidence["split"] == "train.tsv"
    else:  # nothing to correct: the correction does not win, so the simpler default stays
        assert corrected <= raw
        with pytest.raises(DefaultRefused, match=r"qbnorm IS does not beat no correction .*nothing written"):
            _default_evidence(cross_fit, candidate, params, info, force=False)
        assert _default_evidence(cross_fit, candidate, params, info, force=True)["decision"] == "forced"


def test_default_betas_scale_with_the_score_spread():
    from hybrid_retrieval.training.hubness import BETA_PER_SPREAD, scaled_params, score_spread

    rng = np.random.default_rng(0)
    bank, docs = rng.standard_normal((7, 16)).astype(np.float32), rng.standard_normal((300, 16)).astype(np.float32)
    sims = bank @ docs.T
    expected = np.median([np.sort(row)[-100:].std() for row in sims])  # brute force
    assert score_spread(bank, docs, chunk=3) == pytest.approx(expected, rel=1e-6)
    assert score_spread(bank, 2 * docs) == pytest.approx(2 * expected, rel=1e-6)  # twice the scale, twice the spread
    params = scaled_params(0.05, k=2, beta2=3.0)
    assert params == HubnessParams(beta=BETA_PER_SPREAD["beta"] / 0.05, beta1=BETA_PER_SPREAD["beta1"] / 0.05, beta2=3.0, k=2)
    assert scaled_params(0.1).beta == pytest.approx(scaled_params(0.05).beta / 2)
