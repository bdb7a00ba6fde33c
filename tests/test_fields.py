"""Title and text as BM25F fields (search.fields): scores against the formula computed from the analyser's tokens in
plain NumPy, writes and a compaction against a fresh build, and the indexes and specs that cannot weigh fields."""

from __future__ import annotations

import itertools
import json
import shutil

import numpy as np
import pytest
from conftest import sample_queries, write_jsonl

from hybrid_retrieval.common.errors import SpecError
from hybrid_retrieval.indexer.live.collection import Collection
from hybrid_retrieval.indexer.store import open_index

DOCS = 120
WEIGHTS = [{"title": 1.0, "text": 1.0}, {"title": 4.0, "text": 1.0}, {"title": 1.0}, {"text": 2.5}, {"title": 0.3, "text": 1.0}]


@pytest.fixture(scope="module")
def corpus(scifact):
    with (scifact / "corpus.jsonl").open() as fh:
        return [json.loads(line) for line in itertools.islice(fh, DOCS + 20)]


@pytest.fixture(scope="module")
def fielded_index(corpus, tmp_path_factory):
    from hybrid_retrieval.indexer.build import BuildOptions, build_index

    root = tmp_path_factory.mktemp("fields")
    build_index(write_jsonl(root / "corpus.jsonl", corpus[:DOCS]), root / "index", BuildOptions(progress=False))
    return root / "index"


def reference(index, docs: list[dict], query: str, weights: dict[str, float]) -> np.ndarray:
    """BM25F of every document from the analyser's tokens of its title and text (search.fields' formula)."""
    analyze, k1, b = index.analyzer.analyze, index.manifest.bm25.k1, index.manifest.bm25.b
    titles, texts = [analyze(d["title"]) for d in docs], [analyze(d["text"]) for d in docs]
    n = len(docs)
    avg = (sum(map(len, titles)) / n, sum(map(len, texts)) / n)
    w = (weights.get("title", 0.0), weights.get("text", 0.0))
    scores = np.zeros(n)
    for term in index.analyzer.query_terms(query):
        df = sum(term in t or term in x for t, x in zip(titles, texts))
        if not df:
            continue
        idf = np.log(1 + (n - df + 0.5) / (df + 0.5))
        for d, (t, x) in enumerate(zip(titles, texts)):
            combined = w[0] * t.count(term) / (1 - b + b * len(t) / avg[0]) + w[1] * x.count(term) / (1 - b + b * len(x) / avg[1])
            scores[d] += idf * combined / (k1 + combined)
    return scores


def test_bm25f_scores_are_the_formula(fielded_index, corpus, scifact):
    index = open_index(fielded_index)
    pipeline = index.pipeline()
    for query in sample_queries(scifact, 6, 0) + [corpus[3]["title"]]:
        for weights in WEIGHTS:
            expected = reference(index, corpus[:DOCS], query, weights)
            fielded = index.fielded_bm25
            assert fielded is not None
            got = fielded.scores(query, fields=(weights.get("title", 0.0), weights.get("text", 0.0)))
            np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-12)
            result = pipeline.search(query, 10, {"mode": "bm25", "text_fields": weights, "typo": 0})
            order = sorted(np.flatnonzero(expected), key=lambda d: (-expected[d], d))[:10]
            assert result.ranking.doc_idx.tolist() == order
            assert result.spec.text_fields == {"title": weights.get("title", 0.0), "text": weights.get("text", 0.0)}


def test_title_only_matches_titles_only(fielded_index, corpus):
    index = open_index(fielded_index)
    word = index.analyzer.analyze(corpus[7]["title"])[0]
    result = index.pipeline().search(word, 100, {"mode": "bm25", "text_fields": {"title": 1}, "typo": 0})
    assert 7 in result.ranking.doc_idx.tolist()
    assert all(word in index.analyzer.analyze(corpus[d]["title"]) for d in result.ranking.doc_idx.tolist())


def test_fields_after_writes_and_compaction_rank_as_a_fresh_build(fielded_index, corpus, scifact, tmp_path):
    from hybrid_retrieval.indexer.build import BuildOptions, build_index

    shutil.copytree(fielded_index, tmp_path / "index")
    base = open_index(tmp_path / "index")
    collection = Collection(base)
    written = corpus[DOCS:] + [{**corpus[5], "title": "vitamin D and bone density"}]  # a base document's title changed
    collection.upsert([{"id": d["_id"], "title": d["title"], "text": d["text"]} for d in written])
    collection.delete([corpus[2]["_id"], corpus[DOCS]["_id"]])
    final = {d["_id"]: d for d in corpus[:DOCS]} | {d["_id"]: d for d in written}
    for gone in (corpus[2]["_id"], corpus[DOCS]["_id"]):
        final.pop(gone)
    build_index(write_jsonl(tmp_path / "fresh.jsonl", list(final.values())), tmp_path / "fresh", BuildOptions(progress=False))
    fresh = open_index(tmp_path / "fresh", embedder=base.embedder)
    queries = [*sample_queries(scifact, 4, 10), "vitamin D bone density", corpus[DOCS + 3]["title"]]

    def same(view, ids_of) -> None:
        live_pipeline, fresh_pipeline = view.pipeline(), fresh.pipeline()
        for query in queries:
            for weights in WEIGHTS:
                spec = {"mode": "bm25", "text_fields": weights}
                live, expected = live_pipeline.search(query, 20, spec), fresh_pipeline.search(query, 20, spec)
                assert ids_of(live.ranking.doc_idx) == [fresh.doc_ids[i] for i in expected.ranking.doc_idx], (query, weights)
                np.testing.assert_allclose(live.ranking.scores, expected.ranking.scores, rtol=1e-7, atol=1e-9)

    view = collection.refresh()
    same(view, lambda idx: [view.document(int(i))["id"] for i in idx])
    compacted = collection.compact()
    assert compacted.index.postings.has_fields
    same(compacted, lambda idx: [compacted.document(int(i))["id"] for i in idx])
    collection.close()


def test_indexes_that_cannot_weigh_fields_say_so_and_a_compaction_gives_them_fields(fielded_index, corpus, tmp_path):
    shutil.copytree(fielded_index, tmp_path / "old")
    for part in ("title_tfs", "title_lengths"):  # as an index built before fields
        (tmp_path / "old" / "postings" / f"{part}.npy").unlink()
    old = open_index(tmp_path / "old", verify="none")
    with pytest.raises(SpecError, match="keeps no title frequencies") as caught:
        old.pipeline().resolve({"text_fields": {"title": 2}})
    assert caught.value.loc == ("text_fields",)
    assert old.pipeline().resolve({"mode": "dense", "text_fields": {"title": 2}}).mode == "dense"  # no BM25 leg
    collection = Collection(old)  # a compaction analyses the titles an older index lacks
    collection.upsert([{"id": corpus[5]["_id"], "title": corpus[5]["title"], "text": corpus[5]["text"]}])  # as it was
    compacted = collection.compact()
    assert compacted.index.postings.has_fields
    current = open_index(fielded_index)
    for weights in WEIGHTS:
        spec, query = {"mode": "bm25", "text_fields": weights}, "vitamin D deficiency"
        upgraded, built = compacted.pipeline().search(query, 20, spec), current.pipeline().search(query, 20, spec)
        assert [compacted.document(int(i))["id"] for i in upgraded.ranking.doc_idx] == [current.doc_ids[i] for i in built.ranking.doc_idx]
        np.testing.assert_allclose(upgraded.ranking.scores, built.ranking.scores, rtol=1e-12)
    collection.close()
    pipeline = open_index(fielded_index).pipeline()
    for spec, loc, message in [
        ({"text_fields": {"title": 0, "text": 0}}, ("text_fields",), "above 0"),
        ({"text_fields": {"body": 1}}, ("text_fields", "body"), "valid: title, text"),
        ({"text_fields": {"title": -1}}, ("text_fields", "title"), "between 0 and 100"),
        ({"text_fields": ["title"]}, ("text_fields",), "field weights"),
    ]:
        with pytest.raises(SpecError, match=message) as caught:
            pipeline.resolve(spec)
        assert caught.value.loc == loc
