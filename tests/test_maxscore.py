"""Block-max pruned top-k (search.maxscore) equals the exhaustive scorer: same documents, same scores, same tie order, with
filters, deletions and live documents; the exhaustive path (every posting summed) is the reference."""

from __future__ import annotations

import dataclasses
import gc
import json
import weakref

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hybrid_retrieval.indexer.store import open_index
from hybrid_retrieval.search import bm25, maxscore, segments
from hybrid_retrieval.search.analyzer import Analyzer
from hybrid_retrieval.search.bm25 import BM25Index, BM25Params
from hybrid_retrieval.search.filters.language import Allowed
from hybrid_retrieval.search.maxscore import PostingList, exhaustive_scores, score_documents, top_k_pruned, top_matches
from hybrid_retrieval.search.ranking import Ranking, top_k
from hybrid_retrieval.search.segments import LiveBM25, LiveDocument, LiveSegment


def reference(scores: np.ndarray, depth: int, allowed: Allowed | None) -> Ranking:
    """The top `depth` of the matching (non-zero) allowed documents by search.ranking.top_k: numpy, no kernel."""
    admitted = scores != 0 if allowed is None else (scores != 0) & allowed.mask
    return top_k(scores, depth, candidates=np.flatnonzero(admitted))


def assert_same(pruned: Ranking, exhaustive: Ranking) -> None:
    np.testing.assert_array_equal(pruned.doc_idx, exhaustive.doc_idx)
    np.testing.assert_array_equal(pruned.scores, exhaustive.scores)  # bit-identical: the same additions in the same order
    assert pruned.scores.dtype == exhaustive.scores.dtype


@st.composite
def posting_lists(draw):
    """Up to 6 lists over up to 60 documents, with small integer weights: many exact ties, zero weights included."""
    num_docs = draw(st.integers(1, 60))
    lists = []
    for _ in range(draw(st.integers(0, 6))):
        docs = np.array(sorted(draw(st.sets(st.integers(0, num_docs - 1), max_size=num_docs))), dtype=np.int64)
        values = np.array(draw(st.lists(st.integers(0, 4), min_size=len(docs), max_size=len(docs))), dtype=np.float64)
        scale = draw(st.sampled_from([None, 0.5, 1.5]))
        lists.append(PostingList(docs, values, float(values.max(initial=0.0)) * (scale or 1.0), scale))
    return num_docs, lists


@pytest.fixture(scope="module", autouse=True)
def never_give_up():
    """The compiled walk for every query here, however many windows it opens (tests choose the other path
    themselves)."""
    saved, maxscore.GIVE_UP = maxscore.GIVE_UP, 1.0
    yield
    maxscore.GIVE_UP = saved


@given(posting_lists(), st.integers(1, 20), st.sampled_from([1.0, 0.0]), st.sampled_from([0, 1, 2, 6]), st.data())
@settings(max_examples=400, deadline=None)
def test_pruned_top_k_equals_the_exhaustive_top_k(case, depth, give_up, shift, data):
    """Windows of 1, 2, 4 and 64 documents (up to 60 documents here: many windows, or one), visited out of document
    order, so ties and window edges are crossed."""
    num_docs, lists = case
    allowed = None
    if data.draw(st.booleans()):
        allowed = Allowed(np.array(data.draw(st.lists(st.booleans(), min_size=num_docs, max_size=num_docs)), dtype=bool))
    scores = exhaustive_scores(lists, num_docs, np.dtype(np.float64))
    saved = maxscore.WINDOW_SHIFT, maxscore.GIVE_UP
    maxscore.WINDOW_SHIFT, maxscore.GIVE_UP = shift, give_up  # GIVE_UP 1: the walk; 0: the sum it falls back to
    try:
        pruned = top_k_pruned(lists, depth, num_docs, np.dtype(np.float64), allowed)
    finally:
        maxscore.WINDOW_SHIFT, maxscore.GIVE_UP = saved
    assert_same(pruned, reference(scores, depth, allowed))
    ids = np.flatnonzero(np.arange(num_docs) % 3 == 0)
    np.testing.assert_array_equal(score_documents(lists, ids, np.dtype(np.float64)), scores[ids])


@given(
    st.lists(st.integers(-3, 4), min_size=0, max_size=80),
    st.integers(1, 20),
    st.sampled_from([np.float32, np.float64]),
    st.sampled_from(["none", "sparse", "dense"]),
    st.data(),
)
@settings(max_examples=400, deadline=None)
def test_the_top_matches_of_summed_scores_are_numpys_top_k_of_the_non_zero_ones(values, depth, dtype, filtered, data):
    """The compiled one-pass top-k of every document's score (the exhaustive leg) against sorting them in numpy: ties
    (small integers), negative scores (Robertson's idf), fewer matches than asked, and filters on both sides of the
    share below which scores are gathered instead (maxscore.GATHER_BELOW)."""
    scores = np.array(values, dtype=dtype)
    allowed = None
    if filtered != "none" and len(scores):
        mask = np.array(data.draw(st.lists(st.booleans(), min_size=len(scores), max_size=len(scores))), dtype=bool)
        if filtered == "sparse":
            mask &= np.arange(len(mask)) % 20 == 0
        allowed = Allowed(mask)
    assert_same(top_matches(scores, depth, allowed), reference(scores, depth, allowed))


@given(posting_lists(), st.data())
@settings(max_examples=300, deadline=None)
def test_a_group_of_variants_adds_each_documents_best_contribution_once(case, data):
    """A typo's variants (adjacent lists of one group): the exhaustive sum, the scores of given documents and the
    top-k (which sums them instead of pruning) against a NumPy reference: each group's maximum, where a list holds the
    document, added in query order."""
    num_docs, plain = case
    group, lists = 0, []
    for i, posting in enumerate(plain):
        group += i == 0 or data.draw(st.booleans())
        lists.append(PostingList(posting.docs, posting.values, posting.bound, posting.scale, group=group))
    expected = np.zeros(num_docs)
    for g in sorted({p.group for p in lists}):
        best, held = np.zeros(num_docs), np.zeros(num_docs, dtype=bool)
        for posting in (p for p in lists if p.group == g):
            contributions = posting.contributions()
            better = ~held[posting.docs] | (contributions > best[posting.docs])
            best[posting.docs[better]] = contributions[better]
            held[posting.docs] = True
        expected[held] += best[held]
    scores = exhaustive_scores(lists, num_docs, np.dtype(np.float64))
    np.testing.assert_array_equal(scores, expected)
    np.testing.assert_array_equal(score_documents(lists, np.arange(num_docs), np.dtype(np.float64)), expected)
    assert_same(top_k_pruned(lists, 5, num_docs, np.dtype(np.float64)), reference(expected, 5, None))


def test_pruning_never_opens_a_window_capped_below_the_top():
    # a rare term scoring 10 on documents 5 and 7 and 9 on document 900, and a common one on all 1000 documents,
    # bounded by 1 in every window: the first window (cap 11) is opened first, 5 and 7 fill the top 2 (theta 10.5),
    # and every other window is capped below it (900's: 9 + 1), so the common list's entries past the first window
    # are never read (they are NaN: read, they would show in the scores)
    common_docs = np.arange(1000, dtype=np.int64)
    common = np.full(1000, np.nan)
    common[:64] = 0.0
    common[[5, 7, 9]] = [1.0, 0.5, 0.25]
    real = maxscore.WindowBounds.of(common_docs[:64], common[:64], 1000)
    bounded = dataclasses.replace(real, codes=np.full(len(real.codes), 255, dtype=np.uint8))  # 1.0 in every window
    rare = PostingList(np.array([5, 7, 900], dtype=np.int64), np.array([10.0, 10.0, 9.0]), 10.0)
    ranking = top_k_pruned([PostingList(common_docs, common, 1.0, windows=bounded), rare], 2, 1000, np.dtype(np.float64))
    assert ranking.doc_idx.tolist() == [5, 7] and ranking.scores.tolist() == [11.0, 10.5]


def test_window_bounds_cap_every_entry_and_point_at_each_windows_first():
    rng = np.random.default_rng(3)
    docs = np.sort(rng.choice(10_000, 3_000, replace=False))
    values = rng.random(3_000).astype(np.float32)
    bounds = maxscore.WindowBounds.of(docs, values, 10_000)
    window = docs >> bounds.shift
    assert bounds.top == values.max() and len(bounds.codes) == -(-10_000 >> bounds.shift) == 157
    assert np.all(bounds.codes[window] * np.float64(bounds.top) / 255 >= values)
    assert np.all(bounds.codes[np.setdiff1d(np.arange(157), window)] == 0)
    firsts = bounds.bases[np.arange(157) >> 8] + bounds.firsts
    np.testing.assert_array_equal(firsts, np.searchsorted(docs, np.arange(157) << bounds.shift))


@pytest.fixture(scope="module")
def scifact_bm25(scifact):
    analyzer = Analyzer()
    with (scifact / "corpus.jsonl").open() as fh:
        tokens = [analyzer.analyze(f"{d['title']} {d['text']}") for d in map(json.loads, fh)]
    queries = [json.loads(line)["text"] for line in (scifact / "queries.jsonl").open()]
    return BM25Index.build(tokens, analyzer, BM25Params()), queries[:400]


@pytest.mark.parametrize("depth", [1, 10, 100])
def test_scifact_rankings_equal_the_exhaustive_scorer(scifact_bm25, depth):
    index, queries = scifact_bm25
    rng = np.random.default_rng(depth)
    selective = Allowed(rng.random(index.num_docs) < 0.01)  # a 1%-selective filter
    for query in queries:
        scores = index.scores(query)
        for allowed in (None, selective):
            ranking, score_of = index.leg(query, depth, allowed, prune=True)
            assert_same(ranking, reference(scores, depth, allowed))
        ids = np.arange(0, index.num_docs, 7)
        np.testing.assert_array_equal(score_of(ids), scores[ids])


def test_a_full_pool_of_window_bounds_is_replaced_and_rankings_stay_exact(scifact_bm25, monkeypatch):
    """Bounds kept for at most 64 terms (the smallest pool): the 100 queries' terms fill it several times over, each
    full pool replaced by an empty one (rows are never rewritten under a search), and every ranking equals the sum."""
    index, queries = scifact_bm25
    monkeypatch.setattr(bm25, "WINDOW_CACHE_BYTES", 1)
    fresh = BM25Index(index.engine, index.analyzer)
    pools: list = []  # the pools themselves: ids of freed ones could come back
    for query in queries[:100]:
        assert_same(fresh.leg(query, 10, prune=True)[0], reference(fresh.scores(query), 10, None))
        if not any(pool is fresh._pool for pool in pools):
            pools.append(fresh._pool)
        assert fresh._pool.size <= 64 == len(fresh._pool.codes)
    assert len(pools) > 2
    term = fresh.query_token_ids(queries[99])[0]
    start, stop = index.engine.scores["indptr"][term], index.engine.scores["indptr"][term + 1]
    alone = maxscore.WindowBounds.of(index.engine.scores["indices"][start:stop], index.engine.scores["data"][start:stop], index.num_docs)
    pooled = fresh._window_bounds(term)
    for part in ("codes", "firsts", "bases"):
        np.testing.assert_array_equal(getattr(pooled, part), getattr(alone, part))


@pytest.mark.parametrize("method", ["robertson", "bm25l", "bm25+", "atire"])
def test_other_bm25_variants_rank_as_their_exhaustive_scores(method):
    analyzer = Analyzer(stopwords="none", stemmer="none")
    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(30)]
    tokens = [list(rng.choice(words, size=int(rng.integers(3, 12)), p=np.arange(30, 0, -1) / 465)) for _ in range(300)]
    index = BM25Index.build(tokens, analyzer, BM25Params(method=method))
    assert index.prunable == (method == "atire")  # Robertson's idf goes negative; bm25l/bm25+ score non-occurrence
    for query in ["w0 w1", "w29 w3 w3", "w0", "w7 w12 w20 w0"]:
        assert_same(index.leg(query, 10, prune=True)[0], reference(index.scores(query), 10, None))


def test_live_segments_and_deletions_rank_as_the_exhaustive_scorer(scifact_slice_index, scifact):
    index = open_index(scifact_slice_index)
    rng = np.random.default_rng(7)
    alive = rng.random(index.num_docs) > 0.2  # a fifth of the base deleted
    vocabulary: dict[str, int] = {}
    written = []
    with (scifact / "corpus.jsonl").open() as fh:
        for i, line in enumerate(fh):
            if i < 1000 or i % 4:  # documents the base does not hold
                continue
            doc = json.loads(line)
            tokens = index.analyzer.analyze(f"{doc['title']} {doc['text']}")
            written.append(LiveDocument.analysed(doc["_id"], doc["title"], doc["text"], {}, tokens, np.zeros(4), vocabulary))
            if len(written) == 300:
                break
    live = LiveSegment(written, 4, vocabulary)
    bm25 = LiveBM25(index.bm25, index.postings, index.manifest.bm25, alive, live)
    assert bm25.num_docs == index.num_docs + 300
    queries = [json.loads(line)["text"] for line in (scifact / "queries.jsonl").open()][:150]
    mask = rng.random(bm25.num_docs) < 0.3
    for query in queries:
        scores = bm25.scores(query)
        for depth in (10, 100):
            for allowed in (None, Allowed(mask)):
                assert_same(bm25.leg(query, depth, allowed, prune=True)[0], reference(scores, depth, allowed))


def test_base_weights_kept_stay_within_their_byte_budget_and_score_alike(scifact_slice_index, scifact, monkeypatch):
    index = open_index(scifact_slice_index)
    alive = np.ones(index.num_docs, dtype=bool)
    alive[::5] = False  # deletions: the kept weights own their documents too
    queries = [json.loads(line)["text"] for line in (scifact / "queries.jsonl").open()][:40]
    nothing = LiveSegment([], 4, {})
    roomy = LiveBM25(index.bm25, index.postings, index.manifest.bm25, alive, nothing)
    expected = [roomy.scores(query) for query in queries]
    budget = 4096  # a few terms' weights at a time
    monkeypatch.setattr(segments, "WEIGHT_CACHE_BYTES", budget)
    tight = LiveBM25(index.bm25, index.postings, index.manifest.bm25, alive, nothing)
    for _ in range(2):
        for query, scores in zip(queries, expected, strict=True):
            np.testing.assert_array_equal(tight.scores(query), scores)
            assert 0 < tight._base_weights.nbytes <= budget
    assert roomy._base_weights.nbytes > 10 * budget


def test_scorers_are_freed_without_the_cycle_collector(scifact_slice_index, scifact):
    """A refresh makes a new LiveBM25; one its own caches kept in a reference cycle lived, with its weights, segment and
    documents, until a full garbage collection (gigabytes during a bulk load at 1M)."""
    index = open_index(scifact_slice_index)
    query = json.loads((scifact / "queries.jsonl").open().readline())["text"]
    alive = np.ones(index.num_docs, dtype=bool)
    alive[::3] = False
    vocabulary: dict[str, int] = {}
    written = [LiveDocument.analysed("new", "", query, {}, index.analyzer.analyze(query), np.zeros(4), vocabulary)]
    gc.disable()
    try:
        live = LiveSegment(written, 4, vocabulary)
        bm25 = LiveBM25(index.bm25, index.postings, index.manifest.bm25, alive, live)
        own = BM25Index.build([index.analyzer.analyze(query), ["other"]] * 300, index.analyzer, BM25Params())
        assert bm25.leg(query, 10, prune=True)[0].doc_idx[0] == index.num_docs  # the caches hold entries now
        assert own.leg(query, 1, prune=True)[0].scores[0] > 0
        freed = [weakref.ref(bm25), weakref.ref(live), weakref.ref(own)]
        del bm25, live, own
        assert [ref() for ref in freed] == [None, None, None]
    finally:
        gc.enable()
