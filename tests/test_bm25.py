import math

import numpy as np
import pytest

from hybrid_retrieval.search.analyzer import Analyzer
from hybrid_retrieval.search.bm25 import BM25Index, BM25Params, ReferenceBM25
from tests.conftest import TINY_CORPUS

ANALYZER = Analyzer()
TOKENS = [ANALYZER.analyze(f"{d['title']} {d['text']}") for d in TINY_CORPUS]
QUERIES = ["cat", "cats and dogs", "pet care daily", "quantum markets", "running health cat"]


def test_robertson_scores_equal_rank_bm25_okapi():
    # rank-bm25's BM25Okapi is Robertson BM25 with idf = ln((N - n + 0.5) / (n + 0.5)); bm25s
    # drops the constant numerator factor (k1 + 1), which never changes a ranking.
    params = BM25Params(method="robertson", k1=1.2, b=0.75)
    ours = BM25Index.build(TOKENS, ANALYZER, params)
    reference = ReferenceBM25(TOKENS, ANALYZER, params)
    for query in QUERIES:
        np.testing.assert_allclose(ours.scores(query) * (1.2 + 1), reference.scores(query), rtol=1e-5, atol=1e-6)


def test_lucene_score_matches_formula_by_hand():
    # Lucene BM25: idf = ln(1 + (N - n + 0.5)/(n + 0.5)); tf part = tf / (tf + k1 (1 - b + b dl/avgdl)).
    tokens = [["cat", "mat"], ["dog"], ["cat", "cat", "dog", "bird"]]
    index = BM25Index.build(tokens, Analyzer(stopwords="none", stemmer="none"), BM25Params(k1=1.5, b=0.75))
    avgdl = (2 + 1 + 4) / 3
    idf_cat = math.log(1 + (3 - 2 + 0.5) / (2 + 0.5))
    expected_d0 = idf_cat * 1 / (1 + 1.5 * (1 - 0.75 + 0.75 * 2 / avgdl))
    expected_d2 = idf_cat * 2 / (2 + 1.5 * (1 - 0.75 + 0.75 * 4 / avgdl))
    np.testing.assert_allclose(index.scores("cat"), [expected_d0, 0.0, expected_d2], rtol=1e-6)


def test_search_returns_only_matching_documents_sorted():
    index = BM25Index.build(TOKENS, ANALYZER, BM25Params())
    ranking = index.search("cat", depth=10)
    matching = {i for i, toks in enumerate(TOKENS) if "cat" in toks}
    assert set(ranking.doc_idx.tolist()) == matching
    assert np.all(np.diff(ranking.scores) <= 0)
    assert len(index.search("cat", depth=1)) == 1


def test_unknown_words_and_stopwords_give_empty_ranking():
    index = BM25Index.build(TOKENS, ANALYZER, BM25Params())
    assert len(index.search("zzyzx", depth=10)) == 0
    assert len(index.search("the of and", depth=10)) == 0
    for prune in (False, True):  # "s", which Porter stems to "": bm25s's vocabulary holds "" without a column
        assert len(index.leg("S", depth=10, prune=prune)[0]) == 0


def test_save_and_memory_mapped_load_give_same_scores(tmp_path):
    index = BM25Index.build(TOKENS, ANALYZER, BM25Params())
    index.save(tmp_path)
    loaded = BM25Index.load(tmp_path, ANALYZER, mmap=True)
    for query in QUERIES:
        np.testing.assert_array_equal(loaded.scores(query), index.scores(query))


def test_invalid_parameters_are_rejected():
    with pytest.raises(ValueError, match="valid: lucene, robertson"):
        BM25Params(method="tfidf")
    with pytest.raises(ValueError, match="0 <= b <= 1"):
        BM25Params(b=2.0)


@pytest.mark.parametrize("method", ["lucene", "robertson", "atire", "bm25l", "bm25+"])
def test_the_score_matrix_is_the_one_bm25s_indexing_writes(tmp_path, method):
    # BM25Index computes bm25s's score matrix over every entry at once; bm25s's own indexing (document by document,
    # from token ids) must write the same files, byte for byte
    import bm25s

    rng = np.random.default_rng(3)
    words = [f"w{i:02d}" for i in range(60)]
    tokens = [[str(w) for w in rng.choice(words, size=int(rng.integers(0, 40)), p=np.arange(60, 0, -1) / 1830)] for _ in range(400)]
    tokens += [t for t in (ANALYZER.analyze(f"{d['title']} {d['text']}") for d in TINY_CORPUS)]
    params = BM25Params(method=method, k1=1.2, b=0.7, delta=0.6)
    ours = BM25Index.build(tokens, ANALYZER, params)
    ours.save(tmp_path / "ours")
    vocab = {term: i for i, term in enumerate(sorted({t for doc in tokens for t in doc}))}
    engine = bm25s.BM25(method=method, k1=1.2, b=0.7, delta=0.6)
    engine.index(bm25s.tokenization.Tokenized(ids=[[vocab[t] for t in doc] for doc in tokens], vocab=vocab), show_progress=False)
    engine.save(str(tmp_path / "bm25s"), show_progress=False)
    files = sorted(p.name for p in (tmp_path / "bm25s").iterdir())
    assert files == sorted(p.name for p in (tmp_path / "ours").iterdir() if p.name != "analyzer.json")
    for name in files:
        assert (tmp_path / "ours" / name).read_bytes() == (tmp_path / "bm25s" / name).read_bytes(), name


@pytest.mark.parametrize("method", ["lucene", "robertson", "bm25l"])
def test_every_documents_score_is_bm25s_own_sum_of_the_query_columns(method):
    """BM25Index.scores sums the score matrix with a compiled kernel: bit-identical to bm25s's get_scores (its
    np.add.at of each column in query order, plus the non-occurrence score of bm25l), repeated terms included."""
    analyzer = Analyzer()
    corpus = ["the cat sat on the mat", "a dog chased the cat", "cats and dogs", "a mat of moss", "dog dog dog"]
    index = BM25Index.build([analyzer.analyze(text) for text in corpus], analyzer, BM25Params(method=method))
    for query in ("cat", "dog mat", "cat cat moss", "the cat chased a dog on a mat"):
        ids = index.query_token_ids(query)
        np.testing.assert_array_equal(index.scores(query), index.engine.get_scores(ids))
