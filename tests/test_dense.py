import numpy as np
import pytest

from hybrid_retrieval.common.errors import ConfigError
from hybrid_retrieval.search.dense import DenseIndex, FaissParams, build_faiss_index
from hybrid_retrieval.search.filters.language import Allowed
from tests.conftest import centroids


def unit_vectors(n, dim, seed):
    x = np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


DOCS = unit_vectors(2000, 32, seed=0)
QUERIES = unit_vectors(20, 32, seed=1)


def brute_force_top_k(queries, docs, k):
    sims = queries @ docs.T
    return np.argsort(-sims, axis=1, kind="stable")[:, :k], np.sort(sims, axis=1)[:, ::-1][:, :k]


def test_flat_index_equals_brute_force_numpy():
    params = FaissParams()
    dense = DenseIndex(build_faiss_index(DOCS, params, device="cpu"), params, device="cpu")
    expected_idx, expected_scores = brute_force_top_k(QUERIES, DOCS, 10)
    for ranking, idx, scores in zip(dense.search_batch(QUERIES, 10), expected_idx, expected_scores):
        assert ranking.doc_idx.tolist() == idx.tolist()
        np.testing.assert_allclose(ranking.scores, scores, atol=1e-5)


def test_tied_documents_rank_by_index_at_every_depth_and_pages_never_repeat_a_hit():
    """Duplicate documents score the same: FAISS orders them as it likes and picks which make a cut; the dense leg
    orders them by index, as every other ranking does, so a deeper search extends a shallower one."""
    from hybrid_retrieval.search.filters.language import Allowed
    from hybrid_retrieval.search.pipeline import SearchPipeline

    docs = unit_vectors(50, 16, seed=2)[np.random.default_rng(3).integers(0, 50, 300)]  # 300 documents, 50 texts
    query = unit_vectors(1, 16, seed=4)
    params = FaissParams()
    dense = DenseIndex(build_faiss_index(docs, params, device="cpu"), params, device="cpu")
    expected, _ = brute_force_top_k(query, docs, 300)
    for depth in range(1, 300, 7):
        assert dense.search(query[0], depth).doc_idx.tolist() == expected[0][:depth].tolist(), depth
    allowed = Allowed(np.arange(300) % 3 != 0)
    admitted = [d for d in expected[0].tolist() if d % 3 != 0]
    for depth in (5, 40, 150):
        assert dense.search(query[0], depth, allowed).doc_idx.tolist() == admitted[:depth], depth
    pipeline = SearchPipeline(None, dense, None, docs)
    pages = [pipeline.search(None, 10, {"mode": "dense", "depth": 20}, offset=offset, vector=query[0]) for offset in range(0, 300, 10)]
    assert [d for page in pages for d in page.ranking.doc_idx[page.page.start :].tolist()] == expected[0].tolist()


def test_ivf_probing_every_list_is_exact():
    params = FaissParams(kind="ivf", nlist=16, nprobe=16)
    dense = DenseIndex(build_faiss_index(DOCS, params, device="cpu"), params, device="cpu")
    expected_idx, _ = brute_force_top_k(QUERIES, DOCS, 10)
    assert [r.doc_idx.tolist() for r in dense.search_batch(QUERIES, 10)] == expected_idx.tolist()


def test_hnsw_recall_is_high():
    params = FaissParams(kind="hnsw")
    dense = DenseIndex(build_faiss_index(DOCS, params, device="cpu"), params, device="cpu")
    expected_idx, _ = brute_force_top_k(QUERIES, DOCS, 10)
    found = sum(len(set(r.doc_idx.tolist()) & set(e.tolist())) for r, e in zip(dense.search_batch(QUERIES, 10), expected_idx))
    assert found / expected_idx.size >= 0.95


def test_depth_beyond_corpus_returns_whole_corpus_without_padding():
    params = FaissParams()
    dense = DenseIndex(build_faiss_index(DOCS[:5], params, device="cpu"), params, device="cpu")
    ranking = dense.search(QUERIES[0], depth=50)
    assert sorted(ranking.doc_idx.tolist()) == [0, 1, 2, 3, 4]


def test_ivf_clusters_capped_by_training_points():
    assert FaissParams(kind="ivf", nlist=1000).factory(2000) == "IVF51,Flat"


def test_wrong_query_dimension_is_an_error():
    params = FaissParams()
    dense = DenseIndex(build_faiss_index(DOCS, params, device="cpu"), params, device="cpu")
    with pytest.raises(ValueError, match=r"shape \(n, 32\)"):
        dense.search_batch(np.ones((1, 8), dtype=np.float32), 5)


def test_unknown_kind_and_device_list_valid_values():
    with pytest.raises(ValueError, match="valid: flat, ivf, hnsw"):
        FaissParams(kind="lsh")
    with pytest.raises(ValueError, match="valid: auto, cpu, gpu"):
        build_faiss_index(DOCS, FaissParams(), device="tpu")


# Training the product quantizer (256 centroids for each of pq_m sub-vectors) takes most of the time: the slow suite
# trains on 6,000 vectors (a larger variant), the default one on fewer and shorter ones, 4 dimensions a sub-vector in both
@pytest.mark.parametrize("count, dim, pq_m", [(2000, 32, 8), pytest.param(6000, 64, 16, marks=pytest.mark.slow)])
def test_ivfpq_keeps_pq_m_bytes_a_vector_and_ranks_close_to_exact(count, dim, pq_m):
    import faiss

    rng = np.random.default_rng(3)
    docs = unit_vectors(count, dim, seed=4)
    queries = docs[:50] + 0.05 * rng.standard_normal((50, dim)).astype(np.float32)
    params = FaissParams(kind="ivfpq", nlist=16, nprobe=16, pq_m=pq_m)
    index = build_faiss_index(docs, params, "cpu")
    assert params.factory(count) == f"IVF16,PQ{pq_m}x8"
    assert faiss.extract_index_ivf(index).code_size == pq_m  # bytes a vector, vs dim * 4 for flat
    assert not faiss.downcast_index(index).do_polysemous_training  # 50 times the training time, for codes we never use
    exact, _ = brute_force_top_k(queries, docs, 10)

    def recall(rankings):
        return np.mean([len(set(r.doc_idx) & set(e)) / 10 for r, e in zip(rankings, exact)])

    approximate = DenseIndex(index, params, "cpu").search_batch(queries, 10)
    refined = DenseIndex(index, params, "cpu", vectors=docs).search_batch(queries, 10)  # 4 candidates a result, rescored
    assert recall(approximate) >= 0.3 and np.mean([i in r.doc_idx for i, r in enumerate(approximate)]) >= 0.9  # random: 10 / count
    assert recall(refined) > recall(approximate)
    for query, ranking in zip(queries, refined):  # exact cosines, best first
        np.testing.assert_allclose(ranking.scores, docs[ranking.doc_idx] @ query, rtol=1e-5)
        assert list(ranking.scores) == sorted(ranking.scores, reverse=True)
    with pytest.raises(ConfigError, match="does not divide"):
        build_faiss_index(docs, FaissParams(kind="ivfpq", pq_m=10), "cpu")


@pytest.mark.parametrize("kind, factory", [("sq8", "SQ8"), ("hnsw_sq8", "HNSW32,SQ8"), ("ivf_sq8", "IVF51,SQ8")])
def test_scalar_quantized_kinds_keep_a_byte_a_dimension_and_rescore_to_the_exact_ranking(kind, factory):
    import faiss

    params = FaissParams(kind=kind, pq_refine=4)
    index = build_faiss_index(DOCS, params, "cpu")
    assert params.factory(len(DOCS)) == factory
    codes = faiss.downcast_index(index.storage if kind == "hnsw_sq8" else index)  # type: ignore[attr-defined]
    assert codes.code_size == DOCS.shape[1]  # a byte a dimension, vs 4 for float32 (ivf_sq8: 51 clusters, all 64 probed)
    expected_idx, expected_scores = brute_force_top_k(QUERIES, DOCS, 10)
    refined = DenseIndex(index, params, "cpu", vectors=DOCS).search_batch(QUERIES, 10)
    for ranking, idx, scores in zip(refined, expected_idx, expected_scores):  # 40 candidates rescored: the exact top 10
        assert ranking.doc_idx.tolist() == idx.tolist()
        np.testing.assert_allclose(ranking.scores, scores, rtol=1e-6)
    allowed = Allowed(np.arange(len(DOCS)) % 2 == 0)  # 1,000 allowed: the index is searched with a selector
    filtered = DenseIndex(index, params, "cpu", vectors=DOCS).search(QUERIES[0], 10, allowed)
    assert all(i % 2 == 0 for i in filtered.doc_idx)
    np.testing.assert_allclose(filtered.scores, DOCS[filtered.doc_idx] @ QUERIES[0], rtol=1e-6)


def test_an_ivf_index_keeps_its_training_while_its_cluster_count_suits_the_vectors():
    """min(4 * sqrt(n), n // 39) clusters: 25 for 1,000 vectors, 38 for 1,500 (reused: within twice 25), 51 for 2,000
    (trained again)."""
    from hybrid_retrieval.search.dense import fill, ivf_lists, trained_index

    params = FaissParams(kind="ivf_sq8")
    trained = trained_index(DOCS[:1000], params, "cpu")
    assert (ivf_lists(trained), trained.ntotal) == (25, 0)
    assert params.reuses(trained, 1500, 32) and not params.reuses(trained, 2000, 32)
    assert not params.reuses(trained, 1500, 16)  # another dimension
    assert not FaissParams(kind="ivf").reuses(trained, 1500, 32)  # another kind of codes
    assert not FaissParams(kind="ivf_sq8", exact_below=2000).reuses(trained, 1500, 32)  # flat at that size
    kept = trained_index(DOCS[:1500], params, "cpu", reuse=trained)
    np.testing.assert_array_equal(centroids(kept), centroids(trained))
    assert ivf_lists(trained_index(DOCS, params, "cpu", reuse=trained)) == 51
    filled = fill(kept, DOCS[:1500], params, "cpu")
    assert filled.ntotal == 1500 and not params.reuses(filled, 1500, 32)  # a filled index is nobody's training
    assert trained.ntotal == 0  # the copy was filled, not the training
