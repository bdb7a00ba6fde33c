"""group_by: one hit per value of a keyword field, each with its group's best documents; equal to grouping the
ungrouped ranking by hand."""

import itertools
import json

import pytest

from hybrid_retrieval.common.errors import SpecError
from hybrid_retrieval.indexer.build import BuildOptions, build_index
from hybrid_retrieval.indexer.store import open_index
from hybrid_retrieval.search.grouping import GroupBy
from tests.conftest import LengthScorer, write_jsonl


def source_of(i: int):
    """Seven sources; every tenth document has none, every ninth two (it joins the first in sorted order)."""
    if i % 10 == 0:
        return None
    return [f"s{i % 7}", "s0"] if i % 9 == 0 else f"s{i % 7}"


@pytest.fixture(scope="module")
def grouped(scifact, tmp_path_factory):
    root = tmp_path_factory.mktemp("grouped")
    with (scifact / "corpus.jsonl").open() as fh:
        docs = [json.loads(line) for line in itertools.islice(fh, 80)]
    for i, doc in enumerate(docs):
        doc["metadata"] = {"n": i} if source_of(i) is None else {"n": i, "source": source_of(i)}
    build_index(write_jsonl(root / "corpus.jsonl", docs), root / "index", BuildOptions(precision="int8", device="cpu", progress=False))
    index = open_index(root / "index", device="cpu", query_precision="int8")
    yield index
    index.close()


def by_hand(index, ranking, size):
    """Groups in ranking order: (value, [(doc_idx, score)]) with documents lacking the field alone."""
    groups, order = {}, []
    for doc_idx, score in zip(ranking.doc_idx.tolist(), ranking.scores.tolist()):
        source = index.docs.get(doc_idx)["metadata"].get("source")
        key = min(source) if isinstance(source, list) else source
        if key is None:
            order.append((None, [(doc_idx, score)]))
            continue
        if key not in groups:
            groups[key] = []
            order.append((key, groups[key]))
        groups[key].append((doc_idx, score))
    return [(value, members[:size]) for value, members in order]


@pytest.mark.parametrize("mode", ["bm25", "dense", "hybrid"])
def test_groups_equal_grouping_the_ranking_by_hand(grouped, mode):
    pipeline = grouped.pipeline()
    query = "cell growth and DNA damage in cancer"
    full = pipeline.search(query, 80, {"mode": mode, "depth": 80}).ranking
    expected = by_hand(grouped, full, 3)
    result = pipeline.search(query, 5, {"mode": mode, "depth": 80}, group_by=GroupBy("source", 3))
    got = [
        (value, list(zip(members.doc_idx.tolist(), members.scores.tolist())))
        for value, members in zip(result.groups.values, result.groups.members)
    ]
    assert got[:5] == expected[:5] and len(result.ranking) == 5
    assert result.ranking.doc_idx.tolist() == [members[0][0] for _, members in expected[:5]]
    values = [value for value, _ in got if value is not None]
    assert len(values) == len(set(values))  # at most one hit per value
    assert result.has_more == (len(expected) > 5)
    page = pipeline.search(query, 2, {"mode": mode, "depth": 80}, offset=3, group_by=GroupBy("source", 3))
    assert page.ranking.doc_idx[page.page.start :].tolist() == result.ranking.doc_idx[3:5].tolist()
    hits = grouped.presenter().hits(result, query)
    for hit, (value, members) in zip(hits, expected):
        assert hit["group"]["value"] == value and len(hit["group"]["hits"]) <= 3
        assert [m["id"] for m in hit["group"]["hits"]] == [grouped.docs.get(d)["id"] for d, _ in members]
        assert hit["group"]["hits"][0]["id"] == hit["id"]


def test_explain_of_a_grouped_reranked_hit_describes_that_document(grouped):
    """Groups leave reranked documents out: each hit's explanation is still its own reranking and first stage."""
    pipeline = grouped.pipeline({"rerank": {"enabled": True, "depth": 40}}, cross_encoder=LengthScorer(), cross_encoder_name="length")
    query = "cell growth and DNA damage in cancer"
    first = pipeline.search(query, 40, {"mode": "bm25", "depth": 80, "rerank": {"enabled": False}}).ranking
    result = pipeline.search(query, 5, {"mode": "bm25", "depth": 80}, group_by=GroupBy("source", 1))
    reranked = pipeline.search(query, 40, {"mode": "bm25", "depth": 80}).ranking.doc_idx.tolist()
    assert result.ranking.doc_idx.tolist() != reranked[:5]  # the groups did leave some out
    for position, doc in enumerate(result.ranking.doc_idx.tolist()):
        explained = result.explain(position)["rerank"]
        stage = first.doc_idx.tolist().index(doc)
        assert explained["score"] == pytest.approx(len(grouped.doc_text(doc)) / 100.0)
        assert explained["first_stage_rank"] == stage + 1
        assert explained["first_stage_score"] == pytest.approx(float(first.scores[stage]))


def test_bad_group_by_names_the_part(grouped, tiny_index):
    pipeline = grouped.pipeline()
    cases = [
        ({"field": "n"}, "group_by.field", "keyword fields: source"),
        ({"field": "source", "size": 0}, "group_by.size", ""),
        ({"field": "source", "sort": "x"}, "group_by.sort", "valid: field, size"),
        ("source", "group_by", "must be an object"),
    ]
    for value, field, words in cases:
        with pytest.raises(SpecError) as refused:
            pipeline.check_group_by(value)
        assert refused.value.field == field and words in str(refused.value)
    assert pipeline.check_group_by({"field": "source"}) == GroupBy("source", 1)
    with pytest.raises(SpecError, match="keyword fields: lang$"):
        open_index(tiny_index).pipeline().check_group_by({"field": "source"})
