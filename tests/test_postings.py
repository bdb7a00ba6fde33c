"""Query-time BM25 from term-frequency postings equals bm25s's precomputed scores, and follows live statistics."""

import numpy as np
import pytest

from hybrid_retrieval.indexer.store import open_index
from hybrid_retrieval.search.postings import Postings
from tests.conftest import TINY_CORPUS


def query_time_scores(postings: Postings, term_ids, alive, k1=1.5, b=0.75) -> np.ndarray:
    """The Lucene BM25 formula written out, term by term, from the postings."""
    df = postings.document_frequency(alive)
    n = int(alive.sum())
    avgdl = postings.lengths[alive].sum() / n
    scores = np.zeros(postings.num_docs)
    for t in term_ids:
        docs, tfs = postings.term(t)
        keep = alive[docs]
        docs, tf = docs[keep], tfs[keep].astype(float)
        idf = np.log(1 + (n - df[t] + 0.5) / (df[t] + 0.5))
        scores[docs] += idf * tf / (tf + k1 * (1 - b + b * postings.lengths[docs] / avgdl))
    return scores


def test_postings_reproduce_the_bm25s_scores(scifact_slice_index):
    index = open_index(scifact_slice_index)
    postings = Postings.load(scifact_slice_index)
    alive = np.ones(index.num_docs, dtype=bool)
    for query in ["cancer cells grow", "vitamin D deficiency and bone density", "the of and"]:
        ids = index.bm25.query_token_ids(query)
        np.testing.assert_allclose(query_time_scores(postings, ids, alive), index.bm25.scores(query), rtol=1e-5, atol=1e-6)
    assert postings.lengths.sum() == sum(len(index.analyzer.analyze(index.doc_text(i))) for i in range(index.num_docs))


def test_document_frequency_counts_only_alive_documents():
    from hybrid_retrieval.search.analyzer import Analyzer

    analyzer = Analyzer()
    tokens = [analyzer.analyze(f"{d['title']} {d['text']}") for d in TINY_CORPUS]
    postings, vocab = Postings.from_tokens(tokens)
    assert list(vocab) == [*sorted({t for doc in tokens for t in doc}), ""] and list(vocab.values()) == list(range(len(vocab)))
    cat = vocab["cat"]
    assert postings.document_frequency()[cat] == sum("cat" in doc for doc in tokens) == 3
    alive = np.ones(len(tokens), dtype=bool)
    alive[0] = False
    assert postings.document_frequency(alive)[cat] == 2
    docs, tfs = postings.term(cat)
    assert docs.tolist() == [0, 1, 5] and tfs.tolist() == [3, 1, 1]  # "Cats", "cat", "Cats" in d1
    rng = np.random.default_rng(0)
    for _ in range(20):  # every term, against counting the alive documents that hold it
        alive = rng.random(len(tokens)) < rng.random()
        expected = [sum(bool(alive[i]) and term in tokens[i] for i in range(len(tokens))) for term in vocab]
        assert postings.document_frequency(alive).tolist() == expected


def added_terms(written: list[list[str]], titles: list[list[str]]):
    """Written documents' counts as a compaction gets them (search.postings.AddedTerms), counted one by one."""
    from collections import Counter

    from hybrid_retrieval.search.postings import AddedTerms

    vocabulary: dict[str, int] = {}
    counts = []
    for tokens, title in zip(written, titles):
        tally, in_title = Counter(tokens), Counter(title)
        ids = np.array([vocabulary.setdefault(t, len(vocabulary)) for t in tally])
        counts.append((ids, np.array(list(tally.values())), len(tokens), np.array([in_title[t] for t in tally]), len(title)))
    return AddedTerms.of(counts, sorted(vocabulary, key=vocabulary.get))


def test_merged_postings_are_a_fresh_analysis_of_the_same_documents(tmp_path):
    # a compaction merges the base's postings (its alive documents) with the written documents' counts; the result must
    # be what analysing the surviving documents again gives: same vocabulary (a term only deleted documents held is
    # gone, a new term is in), same arrays
    from hybrid_retrieval.search.postings import TermMerge

    base_docs = [["cat", "mat", "cat"], ["dog"], ["yak", "dog"], ["cat", "bird"]]
    base_titles = [["cat"], [], ["yak"], ["cat", "bird"]]  # each document's first tokens
    written = [["zebra", "cat"], ["dog", "dog", "yak"]]
    written_titles = [["zebra"], ["dog"]]
    keep = np.array([True, True, False, True])  # "yak"'s only base document is deleted; a written one has it again
    base, base_vocabulary = Postings.from_tokens(base_docs, base_titles)
    added = added_terms(written, written_titles)
    merge = TermMerge(base, base_vocabulary, keep, added)
    merged, vocabulary = merge.merged()
    saved = tmp_path / "merge"  # as a build in a child process gets it: files (the base's too, not loaded from a folder)
    merge.save(saved)
    again, again_vocabulary = TermMerge.load(saved).merged()
    assert again_vocabulary == vocabulary and again.num_docs == merged.num_docs == 5
    kept = [i for i, k in enumerate(keep) if k]
    fresh, fresh_vocabulary = Postings.from_tokens([base_docs[i] for i in kept] + written, [base_titles[i] for i in kept] + written_titles)
    assert vocabulary == fresh_vocabulary and list(vocabulary)[-1] == ""
    assert fresh.has_fields and fresh.title_term(vocabulary["cat"]).tolist() == [1, 1, 0]  # in 2 titles, not the zebra's
    for name in ("indptr", "docs", "tfs", "lengths", "title_tfs", "title_lengths"):
        np.testing.assert_array_equal(getattr(merged, name), getattr(fresh, name), err_msg=name)
        assert getattr(merged, name).dtype == getattr(fresh, name).dtype, name
        np.testing.assert_array_equal(getattr(again, name), getattr(fresh, name), err_msg=name)


def test_frequencies_are_kept_in_the_narrowest_type_that_holds_them():
    for repeats, dtype in [(255, np.uint8), (256, np.uint16), (65_535, np.uint16), (65_536, np.int32)]:
        postings, vocabulary = Postings.from_tokens([["cat"] * repeats + ["dog"], ["dog"]])
        assert postings.tfs.dtype == dtype and postings.term(vocabulary["cat"])[1].tolist() == [repeats]
        assert postings.term(vocabulary["dog"])[1].tolist() == [1, 1]


@pytest.mark.parametrize("seed", range(5))
def test_a_merge_of_many_documents_is_a_fresh_analysis(seed):
    # entries of every term placed without a sort: terms held by the base only, by written documents only, by both,
    # and terms whose base documents are all deleted
    from hybrid_retrieval.search.postings import TermMerge

    rng = np.random.default_rng(seed)
    words = [f"w{i:02d}" for i in range(40)]

    def documents(n: int) -> tuple[list[list[str]], list[list[str]]]:
        docs = [list(rng.choice(words[: int(rng.integers(5, 40))], size=int(rng.integers(1, 12)))) for _ in range(n)]
        return docs, [doc[: int(rng.integers(0, len(doc) + 1))] for doc in docs]

    (base_docs, base_titles), (written, written_titles) = documents(60), documents(25)
    keep = rng.random(60) < 0.7
    base, base_vocabulary = Postings.from_tokens(base_docs, base_titles)
    added = added_terms(written, written_titles)
    merged, vocabulary = TermMerge(base, base_vocabulary, keep, added).merged()
    kept = np.flatnonzero(keep).tolist()
    fresh, fresh_vocabulary = Postings.from_tokens([base_docs[i] for i in kept] + written, [base_titles[i] for i in kept] + written_titles)
    assert vocabulary == fresh_vocabulary
    for name in ("indptr", "docs", "tfs", "lengths", "title_tfs", "title_lengths"):
        np.testing.assert_array_equal(getattr(merged, name), getattr(fresh, name), err_msg=name)
