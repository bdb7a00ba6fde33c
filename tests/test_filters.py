"""Filters, pages and batches against brute force, on scifact with synthetic metadata derived from the id."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from fastapi.testclient import TestClient

from bench.filter_bench import JOURNALS, synthetic_metadata
from hybrid_retrieval.app.main import create_app
from hybrid_retrieval.app.settings import Settings
from hybrid_retrieval.common.errors import ConfigError, SpecError
from hybrid_retrieval.indexer.build import BuildOptions, build_index
from hybrid_retrieval.indexer.corpus import read_queries
from hybrid_retrieval.indexer.hubness import fit_hubness
from hybrid_retrieval.indexer.manifest import read_manifest
from hybrid_retrieval.indexer.store import open_index, stored_vectors
from hybrid_retrieval.search.dense import DenseIndex, FaissParams, build_faiss_index
from hybrid_retrieval.search.fusion import RRF, Candidates, ConvexCombination, fuse
from hybrid_retrieval.search.hubness import HubnessParams
from hybrid_retrieval.search.pipeline import Query
from hybrid_retrieval.search.ranking import Ranking, top_k
from tests.conftest import TINY_CORPUS, LengthScorer, write_jsonl

# (filter, the same condition in Python over a document's metadata); selectivities over the 500 documents: the last
# three admit 46, 10 and 1 of them
SELECTIVITY = {
    "100%": ({"bucket": {"lt": 1000}}, lambda m: m["bucket"] < 1000),
    "10%": ({"bucket": {"lt": 100}}, lambda m: m["bucket"] < 100),
    "2%": ({"bucket": {"lt": 20}}, lambda m: m["bucket"] < 20),
    "0.2%": ({"bucket": {"$lt": 4}}, lambda m: m["bucket"] < 4),
}
GRAMMAR = [
    ({"journal": "Cell"}, lambda m: m["journal"] == "Cell"),
    ({"journal": {"ne": "Cell"}, "open_access": True}, lambda m: m["journal"] != "Cell" and m["open_access"]),
    (
        {"journal": {"in": ["Nature", "Cell"]}, "year": {"gte": 2005, "lt": 2010}},
        lambda m: m["journal"] in ("Nature", "Cell") and 2005 <= m["year"] < 2010,
    ),
    ({"tags": "genetics"}, lambda m: "genetics" in m["tags"]),
    ({"tags": {"nin": ["genetics", "oncology"]}}, lambda m: not {"genetics", "oncology"} & set(m["tags"])),
    ({"tags": {"exists": False}}, lambda m: not m["tags"]),
    ({"published": {"gte": "2001-06-15", "lte": "2003-01-01T00:00:00Z"}}, lambda m: "2001-06-15" <= m["published"] <= "2003-01-01"),
    ({"journal": {"gt": "JAMA", "lte": "NEJM"}}, lambda m: "JAMA" < m["journal"] <= "NEJM"),
    (
        {"$or": [{"year": 1990}, {"$and": [{"tags": "immunology"}, {"$not": {"open_access": True}}]}]},
        lambda m: m["year"] == 1990 or ("immunology" in m["tags"] and not m["open_access"]),
    ),
    ({"year": {"eq": 1999.5}}, lambda m: False),
]


@pytest.fixture(scope="module")
def meta(scifact_slice, scifact_slice_index, tmp_path_factory):
    """(open index, metadata by internal index) of the scifact slice with synthetic metadata. Metadata leaves the
    embedded text alone, so the slice index's vectors are these documents' vectors: the build takes them rather than
    embedding the same texts again."""
    root = tmp_path_factory.mktemp("scifact-meta")
    with scifact_slice.open() as fh:
        docs = [json.loads(line) for line in fh]
    write_jsonl(root / "corpus.jsonl", [{**doc, "metadata": synthetic_metadata(doc["_id"])} for doc in docs])
    vectors = np.array(stored_vectors(scifact_slice_index))
    build_index(root / "corpus.jsonl", root / "index", BuildOptions(progress=False), embed=lambda *_: vectors)
    index = open_index(root / "index")
    assert index.doc_ids == open_index(scifact_slice_index).doc_ids  # the same documents in the same order
    return index, [index.docs.get(i)["metadata"] for i in range(index.num_docs)]


@pytest.fixture(scope="module")
def queries(scifact):
    return list(read_queries(scifact / "queries.jsonl").values())[:12]


def reference_mask(metadata: list[dict], predicate) -> np.ndarray:
    return np.array([predicate(m) for m in metadata])


def brute_force(index, query: str, vector: np.ndarray, mask: np.ndarray, depth: int) -> dict[str, Ranking]:
    """Each retriever's exact top-`depth` over the documents the mask admits, from the full score arrays."""
    ids = np.flatnonzero(mask)
    bm25 = index.bm25.scores(query)
    dense = np.asarray(index.embeddings) @ vector
    return {"bm25": top_k(bm25, depth, candidates=ids[bm25[ids] != 0]), "dense": top_k(dense, depth, candidates=ids)}


def assert_same(ranking: Ranking, expected: Ranking) -> None:
    assert ranking.doc_idx.tolist() == expected.doc_idx.tolist()
    np.testing.assert_allclose(ranking.scores, expected.scores, atol=1e-5)


def test_manifest_lists_fields_and_types(meta):
    index, _ = meta
    fields = {name: info.type for name, info in index.manifest.metadata.items()}
    assert fields == {"bucket": "int", "year": "int", "journal": "keyword", "tags": "keyword", "published": "date", "open_access": "bool"}
    assert index.manifest.metadata["journal"].distinct == len(JOURNALS)
    assert index.manifest.metadata["tags"].documents == sum(bool(synthetic_metadata(i)["tags"]) for i in index.doc_ids)
    assert all(path in index.manifest.files for path in ("metadata/0.values.npy", "metadata/1.vocab.json", "metadata/4.offsets.npy"))


@pytest.mark.parametrize("expression", range(len(GRAMMAR)))
def test_every_operator_admits_what_the_python_predicate_admits(meta, expression):
    index, metadata = meta
    filter_, predicate = GRAMMAR[expression]
    allowed = index.metadata.allowed(filter_)
    assert allowed.mask.tolist() == reference_mask(metadata, predicate).tolist()


@pytest.mark.parametrize("path", ["brute force", "FAISS selector"])
@pytest.mark.parametrize("selectivity", list(SELECTIVITY))
def test_every_mode_returns_the_brute_force_filtered_ranking(meta, queries, selectivity, path):
    index, metadata = meta
    filter_, predicate = SELECTIVITY[selectivity]
    mask = reference_mask(metadata, predicate)
    if path == "FAISS selector":  # the same flat index searched through faiss.IDSelectorBitmap instead
        index.dense.params = replace(index.dense.params, flat_search_cutoff=0)
    try:
        pipeline = index.pipeline()
        assert pipeline.dense.brute_force(pipeline.allowed(filter_)) == (path == "brute force")
        for query in queries:
            vector = index.query_embedder.encode([query])[0]
            legs = brute_force(index, query, vector, mask, depth=100)
            for mode in ("bm25", "dense"):
                result = pipeline.search(query, k=10, spec={"mode": mode, "filter": filter_})
                assert_same(result.ranking, legs[mode].head(10))
            for fusion in ({"method": "rrf"}, {"method": "cc", "norm": "minmax", "alpha": 0.6}, None):  # None: the default
                result = pipeline.search(query, k=10, spec={"filter": filter_} | ({"fusion": fusion} if fusion else {}))
                candidates = Candidates.from_rankings(
                    legs,
                    {
                        "bm25": lambda i: index.bm25.scores(query)[i],
                        "dense": lambda i: np.asarray(index.embeddings)[i] @ vector,
                    },
                )
                if fusion is None:  # equal-weight z-scores over the union of both filtered top-100 lists, in numpy
                    # (one candidate, or equal scores: std 0 maps to 0, as documented)
                    z = {name: (s - s.mean()) / s.std() if s.std() > 0 else 0 * s for name, s in candidates.scores.items()}
                    fused = 0.5 * z["bm25"] + 0.5 * z["dense"]
                    order = np.lexsort((candidates.doc_idx, -fused))[:10]
                    assert result.ranking.doc_idx.tolist() == candidates.doc_idx[order].tolist()
                    np.testing.assert_allclose(result.ranking.scores, fused[order], rtol=1e-5)
                else:
                    expected = fuse(candidates, ConvexCombination(0.6, "minmax") if fusion["method"] == "cc" else RRF())
                    assert_same(result.ranking, expected.ranking().head(10))
                assert len(result.ranking) == min(10, int(mask.sum()))  # k hits whenever k documents match
                assert mask[result.ranking.doc_idx].all()
    finally:
        index.dense.params = replace(index.dense.params, flat_search_cutoff=FaissParams().flat_search_cutoff)


def test_a_filter_matching_nothing_returns_no_hits(meta):
    index, _ = meta
    for mode in ("bm25", "dense", "hybrid"):
        result = index.pipeline().search("cancer", k=10, spec={"mode": mode, "filter": {"year": {"gt": 2100}}})
        assert len(result.ranking) == 0 and not result.has_more


def test_hubness_corrected_and_reranked_results_honour_the_filter(meta, queries, scifact):
    index, metadata = meta
    bank = list(read_queries(scifact / "queries.jsonl").values())[100:160]
    fit_hubness(index, bank, {"kind": "test queries", "size": len(bank)}, HubnessParams())
    index = open_index(index.path)
    filter_, predicate = SELECTIVITY["10%"]
    mask = reference_mask(metadata, predicate)
    correction = index.hubness.correction
    pipeline = index.pipeline(cross_encoder=LengthScorer())
    for dynamic in (False, True):
        for query in queries[:6]:
            vector = index.query_embedder.encode([query])[0]
            result = pipeline.search(
                query, k=10, spec={"mode": "dense", "hubness": {"method": "qbnorm", "dynamic": dynamic}, "filter": filter_}
            )
            raw_top1 = int(np.argmax(np.asarray(index.embeddings) @ vector))  # DIS decides on the whole corpus
            coef = correction.coefficients("qbnorm", dynamic, raw_top1)
            all_ids = np.arange(index.num_docs)
            corrected = correction.corrected(np.asarray(index.embeddings) @ vector, all_ids, coef)
            assert_same(result.ranking, top_k(corrected, 10, candidates=np.flatnonzero(mask)))
    reranked = pipeline.search(queries[0], k=20, spec={"filter": filter_, "rerank": {"enabled": True, "depth": 10}})
    assert mask[reranked.ranking.doc_idx].all() and len(reranked.ranking) == 20
    lengths = [len(index.doc_text(int(i))) for i in reranked.ranking.doc_idx[:10]]
    assert lengths == sorted(lengths, reverse=True)  # the stand-in scorer's order


@pytest.mark.parametrize(
    "spec",
    [
        {"mode": "bm25"},
        {"mode": "dense"},
        {},
        {"fusion": {"method": "cc"}},
        {"rerank": {"enabled": True, "depth": 15}},
        {"filter": {"bucket": {"lt": 100}}},
    ],
)
def test_page_two_is_ranks_11_to_20_with_the_same_scores(meta, queries, spec):
    index, _ = meta
    pipeline = index.pipeline(cross_encoder=LengthScorer())
    for query in queries[:4]:
        first20 = pipeline.search(query, k=20, spec=spec)
        page2 = pipeline.search(query, k=10, spec=spec, offset=10)
        assert list(page2.page) == list(range(10, len(page2.ranking)))
        assert page2.ranking.doc_idx[10:].tolist() == first20.ranking.doc_idx[10:20].tolist()
        np.testing.assert_array_equal(page2.ranking.scores[10:], first20.ranking.scores[10:20])
        assert page2.has_more == first20.has_more  # both reach rank 20


def test_has_more_is_false_on_the_last_page(meta):
    index, metadata = meta
    matching = int(reference_mask(metadata, SELECTIVITY["2%"][1]).sum())
    pipeline = index.pipeline()
    last = pipeline.search("cancer", k=5, spec={"mode": "dense", "filter": SELECTIVITY["2%"][0]}, offset=matching - 5)
    assert len(last.page) == 5 and not last.has_more
    before = pipeline.search("cancer", k=5, spec={"mode": "dense", "filter": SELECTIVITY["2%"][0]}, offset=matching - 6)
    assert before.has_more
    with pytest.raises(SpecError, match="offset"):
        pipeline.search("cancer", k=5, offset=10_001)


def test_search_many_equals_single_searches_and_names_a_bad_item(meta, queries):
    index, _ = meta
    pipeline = index.pipeline()
    specs = [{}, {"mode": "bm25"}, {"mode": "dense", "filter": {"journal": "Cell"}}]
    batch = pipeline.search_many([Query(q, 7, specs[i % 3], i % 2) for i, q in enumerate(queries)])
    for i, (query, result) in enumerate(zip(queries, batch)):
        single = pipeline.search(query, 7, specs[i % 3], offset=i % 2)
        assert result.ranking.doc_idx.tolist() == single.ranking.doc_idx.tolist()
        np.testing.assert_allclose(result.ranking.scores, single.ranking.scores, atol=1e-5)
    with pytest.raises(SpecError) as error:
        pipeline.search_many([Query("a"), Query("b", spec={"filter": {"journal": 3}})])
    assert error.value.field == "searches[1].filter.journal"


def test_ann_indexes_with_a_selector_and_the_cost_rule(meta, queries):
    """HNSW over the same vectors: the selector path keeps recall at 10%; the cost rule makes rare filters exact."""
    index, _ = meta
    vectors = np.asarray(index.embeddings)
    params = FaissParams(kind="hnsw", flat_search_cutoff=0)
    hnsw = DenseIndex(build_faiss_index(vectors, params, "cpu"), params, "cpu")
    allowed = index.metadata.allowed(SELECTIVITY["10%"][0])
    found = []
    for query in queries:
        vector = index.query_embedder.encode([query])[0]
        exact = top_k(vectors @ vector, 10, candidates=allowed.ids).doc_idx
        got = hnsw.search(vector, 10, allowed).doc_idx
        assert allowed.mask[got].all()
        found.append(len(set(exact) & set(got)) / 10)
    assert np.mean(found) >= 0.9
    assert DenseIndex(hnsw._index, FaissParams(kind="hnsw"), "cpu").brute_force(allowed)


def test_filterable_restricts_and_a_corpus_without_metadata_costs_nothing(tmp_path):
    docs = [{**doc, "year": 2000 + i, "journal": "Cell", "mixed": [1, "one"][i % 2]} for i, doc in enumerate(TINY_CORPUS)]
    corpus = write_jsonl(tmp_path / "corpus.jsonl", docs)
    manifest = build_index(corpus, tmp_path / "restricted", BuildOptions(progress=False, filterable=("year",)))
    assert {n: (i.type, i.reason) for n, i in manifest.metadata.items()} == {
        "year": ("int", None),
        "journal": (None, "not listed in --filterable"),
        "lang": (None, "not listed in --filterable"),
        "mixed": (None, "values of several types (int, keyword)"),
    }
    with pytest.raises(SpecError, match="filter.journal: is not filterable"):
        open_index(tmp_path / "restricted").pipeline().search("cat", spec={"filter": {"journal": "Cell"}})
    with pytest.raises(ConfigError, match="'mixed', which cannot be filtered"):
        build_index(corpus, tmp_path / "bad", BuildOptions(progress=False, filterable=("mixed",)))
    plain = write_jsonl(tmp_path / "plain.jsonl", [{k: v for k, v in d.items() if k != "lang"} for d in TINY_CORPUS])
    build_index(plain, tmp_path / "plain", BuildOptions(progress=False))
    index = open_index(tmp_path / "plain")
    assert index.metadata is None and not (tmp_path / "plain" / "metadata").exists() and read_manifest(index.path).metadata == {}
    with pytest.raises(SpecError, match="no filterable metadata"):
        index.pipeline().search("cat", spec={"filter": {"year": 1}})


@pytest.fixture(scope="module")
def client(meta):
    index, _ = meta
    with TestClient(create_app(Settings(), index=open_index(index.path))) as client:
        yield client


@pytest.mark.parametrize(
    "filter_, loc",
    [
        ({"yr": 1}, ["filter", "yr"]),
        ({"year": {"gte": "2015"}}, ["filter", "year", "gte"]),
        ({"year": {"between": [1, 2]}}, ["filter", "year", "between"]),
        ({"$or": [{"year": 1}, {"tags": {"in": ["a", 2]}}]}, ["filter", "$or", 1, "tags", "in", 1]),
        ({"open_access": {"gt": True}}, ["filter", "open_access", "gt"]),
        ({"published": {"lt": "last year"}}, ["filter", "published", "lt"]),
        ({"journal": ["Cell"]}, ["filter", "journal"]),
    ],
)
@pytest.mark.server
def test_bad_filters_answer_422_naming_the_path(client, filter_, loc):
    response = client.post("/search", json={"query": "cancer", "filter": filter_})
    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["loc"] == ["body", *loc]


@pytest.mark.server
def test_api_filter_fields_facets_and_pages(client, meta):
    index, metadata = meta
    body = {
        "query": "cancer treatment",
        "k": 5,
        "filter": {"journal": {"in": ["Nature", "Cell"]}},
        "fields": ["year", "journal"],
        "facets": ["journal", "open_access"],
    }
    first = client.post("/search", json=body).json()
    assert all(hit["fields"]["journal"] in ("Nature", "Cell") and set(hit["fields"]) == {"year", "journal"} for hit in first["hits"])
    pool = index.pipeline().search(body["query"], k=5, spec={"filter": body["filter"]}).pool
    expected = {}
    for i in pool:
        expected[metadata[i]["journal"]] = expected.get(metadata[i]["journal"], 0) + 1
    assert {f["value"]: f["count"] for f in first["facets"]["journal"]} == expected
    assert sum(f["count"] for f in first["facets"]["open_access"]) == len(pool)
    second = client.post("/search", json={**body, "offset": 5}).json()
    assert [h["rank"] for h in second["hits"]] == [6, 7, 8, 9, 10] and second["offset"] == 5 and second["has_more"]
    ten = client.post("/search", json={**body, "k": 10}).json()
    assert [h["id"] for h in ten["hits"]] == [h["id"] for h in first["hits"] + second["hits"]]
    everything = client.post("/search", json={"query": "cancer", "k": 1, "fields": "*"}).json()["hits"][0]["fields"]
    assert set(everything) == set(synthetic_metadata("1"))
    unknown = client.post("/search", json={"query": "cancer", "fields": ["year", "volume"]})
    assert unknown.status_code == 422 and unknown.json()["detail"][0]["loc"] == ["body", "fields", 1]
    float_facet = client.post("/search", json={"query": "cancer", "facets": ["published"]})
    assert float_facet.status_code == 422 and "cannot be counted" in float_facet.text


@pytest.mark.server
def test_batch_answers_like_single_requests_and_rejects_a_bad_item_whole(client):
    searches = [
        {"query": "cancer", "k": 3},
        {"query": "vaccine", "mode": "bm25", "filter": {"year": {"gte": 2000}}},
        {"query": "diabetes", "highlight": True, "offset": 2, "k": 2},
    ]
    batch = client.post("/search/batch", json={"searches": searches})
    assert batch.status_code == 200
    for item, result in zip(searches, batch.json()["results"]):
        single = client.post("/search", json=item).json()
        assert [(h["id"], round(h["score"], 5)) for h in result["hits"]] == [(h["id"], round(h["score"], 5)) for h in single["hits"]]
        assert result["spec"] == single["spec"]
    bad = client.post("/search/batch", json={"searches": [searches[0], {"query": "x", "filter": {"nope": 1}}]})
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["body", "searches", 1, "filter", "nope"]
    too_many = client.post("/search/batch", json={"searches": [searches[0]] * 65})
    assert too_many.status_code == 422


@pytest.mark.server
def test_highlights_in_the_api_mark_stemmed_terms(client):
    hits = client.post("/search", json={"query": "tumors", "k": 3, "mode": "bm25", "highlight": {"snippets": 2}}).json()["hits"]
    for hit in hits:
        snippets = hit["highlight"]["title"] + hit["highlight"]["text"]
        assert snippets and all("tumor" in s["terms"] for s in snippets)
        assert all(s["text"].count("<mark>") == len(s["matches"]) for s in snippets)


@pytest.mark.server
def test_semantic_highlight_for_a_purely_dense_match(client, meta):
    index, _ = meta
    query = "zzzunknownword physiology"  # one term no document has: dense hits without a term match exist
    body = client.post(
        "/search", json={"query": query, "k": 10, "mode": "dense", "include_text": True, "highlight": {"semantic": True}}
    ).json()
    dense_only = [hit for hit in body["hits"] if not hit["highlight"]["title"] and not hit["highlight"]["text"]]
    assert dense_only
    for hit in dense_only:
        sentence = hit["highlight"]["semantic"]
        assert hit["text"][sentence["start"] : sentence["end"]].startswith(sentence["text"][:10].split("&")[0])
        vector = index.query_embedder.encode([query])[0]
        expected = float(index.embedder.encode([hit["text"][sentence["start"] : sentence["end"]]])[0] @ vector)
        assert sentence["score"] == pytest.approx(expected, abs=1e-4)
