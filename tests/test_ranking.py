import numpy as np

from hybrid_retrieval.search.ranking import top_k


def test_top_k_sorts_descending_and_breaks_ties_by_index():
    scores = np.array([0.5, 0.9, 0.5, 0.1, 0.9, 0.5])
    ranking = top_k(scores, 4)
    assert ranking.doc_idx.tolist() == [1, 4, 0, 2]
    assert ranking.scores.tolist() == [0.9, 0.9, 0.5, 0.5]


def test_top_k_among_candidates_returns_original_indices():
    scores = np.array([3.0, 1.0, 2.0, 5.0])
    ranking = top_k(scores, 2, candidates=np.array([0, 1, 2]))
    assert ranking.doc_idx.tolist() == [0, 2]


def test_top_k_larger_than_input_returns_everything():
    assert top_k(np.array([1.0, 2.0]), 10).doc_idx.tolist() == [1, 0]
