"""Typo tolerance (search.typo): the edit distance against a plain dynamic-programming reference, the budget rules,
and BM25 scores of a misspelt query against the same scores built by hand in NumPy, for an index and a collection
with written and deleted documents."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hybrid_retrieval.common.errors import SpecError
from hybrid_retrieval.search.analyzer import Analyzer
from hybrid_retrieval.search.bm25 import BM25Index, BM25Params
from hybrid_retrieval.search.postings import Postings
from hybrid_retrieval.search.segments import LiveBM25, LiveDocument, LiveSegment
from hybrid_retrieval.search.typo import VARIANT_WEIGHTS, Lexicon, check_typo, edit_budget, one_edit_away


def osa(a: str, b: str) -> int:
    """Optimal string alignment distance, the textbook table."""
    table = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
    for i in range(len(a) + 1):
        table[i][0] = i
    for j in range(len(b) + 1):
        table[0][j] = j
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            table[i][j] = min(table[i - 1][j] + 1, table[i][j - 1] + 1, table[i - 1][j - 1] + (a[i - 1] != b[j - 1]))
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                table[i][j] = min(table[i][j], table[i - 2][j - 2] + 1)
    return table[len(a)][len(b)]


words = st.text(alphabet="abcdeé中", min_size=0, max_size=9)


@given(st.lists(words, max_size=40, unique=True), words, st.integers(0, 3))
@settings(max_examples=500, deadline=None)
def test_a_lexicon_finds_exactly_the_terms_within_the_edits(terms, term, edits):
    lexicon = Lexicon(terms)
    found = [(lexicon.terms[at], distance) for at, distance in lexicon.near(term, edits)]
    assert sorted(found) == sorted((t, osa(t, term)) for t in terms if 0 < osa(t, term) <= edits)


def test_one_edit_neighbours_are_one_edit_away_and_include_each_kind_of_edit():
    neighbours = one_edit_away("vitamn")
    assert {"vitamin", "vitman", "itamn", "vitamns"} <= set(neighbours) and "vitamn" not in neighbours
    assert all(osa(n, "vitamn") == 1 for n in neighbours)


def test_the_budget_follows_the_length_of_the_word():
    assert [edit_budget(w, "auto") for w in ("cell", "cells", "vitamins", "deficiency")] == [0, 1, 1, 2]
    assert [edit_budget(w, 1) for w in ("cell", "deficiency")] == [0, 1]
    assert edit_budget("deficiency", 0) == 0 and edit_budget("deficiency", 2) == 2
    assert edit_budget("自然言語処理", "auto") == 0  # CJK bigrams are never expanded
    for bad in (3, "yes", True, None):
        with pytest.raises(SpecError, match="typo"):
            check_typo(bad)


CORPUS = [
    "vitamin d deficiency in children",
    "vitamins and minerals in the diet",
    "vitality of older adults",
    "protein folding and misfolding",
    "iron deficiency anaemia",
    "dorsally located neurons",
    "cell signalling",
]


@pytest.fixture(scope="module")
def index() -> BM25Index:
    analyzer = Analyzer()
    return BM25Index.build([analyzer.analyze(text) for text in CORPUS], analyzer, BM25Params())


def test_a_misspelt_term_scores_as_the_best_of_its_variants(index):
    """Reference: each held term's column summed, and for the misspelt one the best weighted column of its variants."""
    variants = index.variants("vitamn deficiency", "auto")
    assert variants == {"vitamn": [("vitamin", 1)]}  # "vitamin" is one insertion away; "vitamins" stems to it
    expected = VARIANT_WEIGHTS[1] * index.scores("vitamin") + index.scores("deficiency")
    np.testing.assert_allclose(index.scores("vitamn deficiency", "auto"), expected, rtol=1e-6)
    np.testing.assert_array_equal(index.scores("vitamn deficiency", 0), index.scores("deficiency"))
    for prune in (True, False):
        ranking = index.leg("vitamn deficiency", 3, prune=prune, typo="auto")[0]
        assert ranking.doc_idx.tolist() == np.argsort(-expected, kind="stable")[:3].tolist()


def test_several_variants_count_once_a_document_the_best(index):
    variants = dict(index.variants("vitamis", 2)["vitami"])  # "vitamis" stems to "vitami"
    assert {"vitamin", "vital"} <= set(variants)
    columns = [VARIANT_WEIGHTS[d] * index.scores(term) for term, d in variants.items()]
    np.testing.assert_allclose(index.scores("vitamis", 2), np.max(columns, axis=0), rtol=1e-6)
    _, score_of = index.leg("vitamis", 5, typo=2)
    ids = np.arange(index.num_docs)
    np.testing.assert_array_equal(score_of(ids), index.scores("vitamis", 2))


def test_a_swap_in_a_suffix_the_stemmer_strips_still_finds_the_stem(index):
    assert index.variants("dorsalyl", "auto") == {"dorsalyl": [("dorsal", 1)]}


def test_held_terms_and_short_ones_are_taken_as_written(index):
    for query in ("vitamin deficiency", "protein folding", "cel signalling"):  # "cel": under 5 letters
        np.testing.assert_array_equal(index.scores(query, "auto"), index.scores(query, 0))
    assert index.variants("protein folding cel", "auto") == {}


def test_a_collection_matches_typos_to_written_terms_and_not_to_deleted_ones(index):
    """LiveBM25 with typos equals a fresh build of the documents that exist (the statistics of exactly those)."""
    analyzer = index.analyzer
    postings, _ = Postings.from_tokens([analyzer.analyze(text) for text in CORPUS])
    vocabulary: dict[str, int] = {}
    written_texts = ["zebrafish regeneration", "zebrafish larvae and vitamins"]
    written = [LiveDocument.analysed(f"w{i}", "", t, {}, analyzer.analyze(t), np.zeros(2), vocabulary) for i, t in enumerate(written_texts)]
    alive = np.ones(len(CORPUS), dtype=bool)
    alive[CORPUS.index("dorsally located neurons")] = False
    live = LiveBM25(index, postings, BM25Params(), alive, LiveSegment(written, 2, vocabulary))
    existing = [text for text, kept in zip(CORPUS, alive) if kept] + written_texts
    fresh = BM25Index.build([analyzer.analyze(text) for text in existing], analyzer, BM25Params())
    order = [i for i in range(len(CORPUS)) if alive[i]] + [len(CORPUS) + i for i in range(len(written_texts))]
    for query in ("zebrafsih", "vitamn deficiency", "dorsalyl neurons"):
        assert live.variants(query, "auto") == fresh.variants(query, "auto")
        np.testing.assert_allclose(live.scores(query, typo="auto")[order], fresh.scores(query, "auto"), rtol=1e-5)
    assert live.variants("zebrafsih", "auto") == {"zebrafsih": [("zebrafish", 1)]}  # only written documents hold it
    assert live.variants("dorsalyl", "auto") == {"dorsalyl": []}  # its one document is deleted


def test_words_analyse_to_one_term_each_or_none():
    analyzer = Analyzer()
    tokens = [analyzer.token_of(word) for word in ["Dorsally", "the", "co-op", "Running", ""]]
    assert tokens == ["dorsally", "the", None, "running", None]
    assert analyzer.stem_tokens(["dorsally", "the", "running"]) == ["dorsal", None, "run"]
    assert analyzer.stem_tokens(["dorsally"]) == [analyzer.analyze("dorsally")[0]]
    assert Analyzer(fold_accents=True).token_of("Café") == "cafe"
