"""A live segment extended refresh by refresh (search.segments.LiveSegment.extended) holds exactly what one built
from all its documents at once holds: postings, lengths, vectors, passages, metadata fields and columns."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from hybrid_retrieval.search.segments import LiveDocument, LiveSegment

WORDS = [f"w{i}" for i in range(12)]
TYPES = {"year": "int", "tag": "keyword", "late": "keyword", "note": None}  # note: not filterable


@st.composite
def documents(draw):
    """Documents with words from a small vocabulary (so terms repeat across refreshes), some with passages, and a
    metadata field ("late") that only documents after the first few hold."""
    count = draw(st.integers(1, 40))
    rows = []
    for i in range(count):
        tokens = draw(st.lists(st.sampled_from(WORDS), max_size=8))
        metadata = {"year": draw(st.integers(1990, 1995)), "note": "x"}
        if draw(st.booleans()):
            metadata["tag"] = draw(st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=2))
        if i >= 5 and draw(st.booleans()):
            metadata["late"] = draw(st.sampled_from(["p", "q"]))
        passages = draw(st.integers(0, 3))
        rows.append((tokens, metadata, passages))
    cuts = sorted(set(draw(st.lists(st.integers(1, count), max_size=6))))
    return rows, cuts


def made(rows, vocabulary: dict[str, int]) -> list[LiveDocument]:
    rng = np.random.default_rng(len(rows))
    docs = []
    for i, (tokens, metadata, passages) in enumerate(rows):
        spans = np.array([[k, k + 1] for k in range(passages)], dtype=np.int64).reshape(-1, 2)
        parts = (spans, rng.standard_normal((passages, 3)).astype(np.float32)) if passages else None
        vector = rng.standard_normal(3).astype(np.float32)
        docs.append(LiveDocument.analysed(f"d{i}", "", "abc", metadata, tokens, vector, vocabulary, passages=parts))
    return docs


def assert_same_segment(extended: LiveSegment, whole: LiveSegment) -> None:
    assert [d.doc_id for d in extended.docs] == [d.doc_id for d in whole.docs]
    for word in [*WORDS, "absent"]:
        for got, expected in zip(extended.postings(word), whole.postings(word), strict=True):
            np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(extended.lengths, whole.lengths)
    np.testing.assert_array_equal(extended.vectors, whole.vectors)
    np.testing.assert_array_equal(extended.passage_rows, whole.passage_rows)
    np.testing.assert_array_equal(extended.passage_spans, whole.passage_spans)
    np.testing.assert_array_equal(extended.passage_vectors, whole.passage_vectors)
    assert extended.fields == whole.fields
    got, expected = extended.columns(TYPES, ["year"]), whole.columns(TYPES, ["year"])
    assert sorted(got.columns) == sorted(expected.columns) == ["late", "tag", "year"]
    for filter_ in ({"year": {"gte": 1993}}, {"tag": "a"}, {"tag": {"in": ["b", "c"]}}, {"late": "q"}, {"year": {"in": [1990, 1995]}}):
        np.testing.assert_array_equal(got.allowed(filter_).mask, expected.allowed(filter_).mask)


@given(documents())
@settings(max_examples=150, deadline=None)
def test_an_extended_segment_equals_one_built_at_once(case):
    rows, cuts = case
    vocabulary: dict[str, int] = {}
    docs = made(rows, vocabulary)
    bounds = [0, *cuts, len(docs)]
    segment = LiveSegment(docs[: bounds[1]], 3, vocabulary)
    segment.columns(TYPES, ["year"])  # each refresh's view makes its columns: the next one extends them
    kept = [segment]
    for start, end in itertools.pairwise(bounds[1:]):
        segment = segment.extended(docs[start:end])
        segment.columns(TYPES, ["year"])
        kept.append(segment)
    assert_same_segment(segment, LiveSegment(docs, 3, vocabulary))
    for older in kept:  # a search still reading an older segment sees it unchanged
        assert_same_segment(older, LiveSegment(docs[: len(older)], 3, vocabulary))
