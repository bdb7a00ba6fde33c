"""Boosts, sort and curation (search.boosts, search.sorting, search.curation) against a reference written in plain
Python and NumPy: every retriever's list cut by hand from the exhaustive scores, fused by the RRF formula, boosted by
the formulas of the docs, sorted and pinned by Python's own sort, paged by slicing."""

from __future__ import annotations

import itertools
import json
import math
import os
import random
from datetime import datetime, timezone

import numpy as np
import pytest
from conftest import write_jsonl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hybrid_retrieval.common.errors import SpecError
from hybrid_retrieval.indexer.store import open_index
from hybrid_retrieval.search.curation import Curation, check_rules, for_query
from hybrid_retrieval.search.pipeline import Stopwatch

DOCS = 200
EXAMPLES = int(os.environ.get("STEER_EXAMPLES", 1000))  # the acceptance's 1,000 combinations by default
TAGS = ["a", "b", "c", "d"]


def generated_metadata(i: int) -> dict:
    r = random.Random(i)
    meta = {
        "price": round(r.uniform(1, 500), 2),
        "popularity": r.randint(0, 1000),
        "tags": r.sample(TAGS, r.randint(1, 2)),
        "in_stock": r.random() < 0.7,
        "published": f"20{r.randint(10, 24):02d}-{r.randint(1, 12):02d}-{r.randint(1, 28):02d}",
    }
    return {name: value for name, value in meta.items() if r.random() >= 0.15}  # some documents lack a field


@pytest.fixture(scope="module")
def steer_index(scifact, tmp_path_factory):
    from hybrid_retrieval.indexer.build import BuildOptions, build_index

    root = tmp_path_factory.mktemp("steer")
    with (scifact / "corpus.jsonl").open() as fh:
        docs = [{**json.loads(line), "metadata": generated_metadata(i)} for i, line in enumerate(itertools.islice(fh, DOCS))]
    build_index(write_jsonl(root / "corpus.jsonl", docs), root / "index", BuildOptions(progress=False))
    return root / "index", docs


@pytest.fixture(scope="module")
def opened(steer_index):
    path, docs = steer_index
    index = open_index(path)
    queries = [docs[i]["title"] for i in range(0, 40, 4)]
    queries.append(misspelt(queries[0]))
    queries.append(misspelt(queries[1]))
    vectors = {q: index.query_embedder.encode([q])[0] for q in queries}
    return index, docs, queries, vectors


def misspelt(text: str) -> str:
    """The longest word with its middle two letters swapped."""
    word = max(text.split(), key=len)
    mid = len(word) // 2
    return text.replace(word, word[: mid - 1] + word[mid] + word[mid - 1] + word[mid + 1 :], 1)


def epoch(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=timezone.utc).timestamp()


# --- the reference ---------------------------------------------------------------------------------------------------

FILTERS = [
    None,
    {"in_stock": True},
    {"price": {"gte": 100}},
    {"tags": {"in": ["a", "b"]}},
    {"published": {"lt": "2018-01-01"}},
    {"$or": [{"tags": "c"}, {"popularity": {"gte": 500}}]},
]


def admits(condition: dict | None, meta: dict) -> bool:
    if condition is None:
        return True
    for name, want in condition.items():
        if name == "$or":
            if not any(admits(part, meta) for part in want):
                return False
            continue
        if name not in meta:
            return False
        values = meta[name] if isinstance(meta[name], list) else [meta[name]]
        if not isinstance(want, dict):
            ok = want in values
        elif "in" in want:
            ok = any(v in want["in"] for v in values)
        else:
            value = epoch(values[0]) if name == "published" else values[0]
            bound = {op: epoch(v) if name == "published" else v for op, v in want.items()}
            ok = all({"gte": value >= b, "lt": value < b}[op] for op, b in bound.items())
        if not ok:
            return False
    return True


def boost_value(boost: dict, meta: dict) -> float:
    if "filter" in boost:
        return 1.0 if admits(boost["filter"], meta) else 0.0
    name = boost["field"]
    if "decay" in boost:
        if name not in meta:
            return 0.0
        seconds = {"d": 86400, "h": 3600}
        to_number = (lambda v: epoch(v)) if name == "published" else float
        length = (lambda v: float(v[:-1]) * seconds[v[-1]] if isinstance(v, str) else float(v)) if name == "published" else float
        d = max(0.0, abs(to_number(meta[name]) - to_number(boost["origin"])) - length(boost.get("offset", 0)))
        scale, decay = length(boost["scale"]), boost.get("decay_at_scale", 0.5)
        if boost["decay"] == "gauss":
            sigma2 = -(scale**2) / (2 * math.log(decay))
            return math.exp(-(d**2) / (2 * sigma2))
        if boost["decay"] == "exp":
            return math.exp(math.log(decay) / scale * d)
        return max(0.0, (scale / (1 - decay) - d) / (scale / (1 - decay)))
    value = float(meta.get(name, boost.get("missing", 0.0)))
    modifier = boost.get("modifier", "none")
    return {
        "none": value,
        "log1p": math.log10(1 + max(value, 0)),
        "ln1p": math.log(1 + max(value, 0)),
        "sqrt": math.sqrt(max(value, 0)),
        "square": value * value,
    }[modifier]


def sort_key(keys: list, meta: dict, score: float, doc: int, vocab: list[str]) -> tuple:
    parts: list = []
    for key in keys:
        name, _, order = key.partition(":")
        desc = order == "desc" if order else name == "_score"
        sign = -1 if desc else 1
        if name == "_score":
            parts += [0, sign * score]
            continue
        if name not in meta:
            parts += [1, 0]
            continue
        value = meta[name]
        if isinstance(value, list):  # smallest ascending, largest descending, by value order
            value = vocab.index(max(value) if desc else min(value))
        elif name == "published":
            value = epoch(value)
        parts += [0, sign * float(value)]
    return (*parts, -score, doc)


def zscores(values: list[float]) -> list[float]:
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
    return [0.0 if std == 0 else (v - mean) / std for v in values]


def reference(opened, case: dict) -> tuple[list[str], list[float], bool]:
    index, docs, _, vectors = opened
    meta = [d["metadata"] for d in docs]
    ids = [d["_id"] for d in docs]
    hidden = set(case["hidden"])
    admitted = [i for i in range(DOCS) if admits(case["filter"], meta[i]) and ids[i] not in hidden]
    query, mode, depth, steered = case["query"], case["mode"], case["depth"], bool(case["boosts"] or case["sort"])
    # exhaustive BM25: every matching document's score (the leg over all of them), cut by hand below
    full = index.pipeline().bm25_leg(query, DOCS, Stopwatch(), None, None, case["typo"], case["text_fields"])[1]
    bm25 = dict(zip(full.doc_idx.tolist(), full.scores.astype(np.float64).tolist()))
    cosine = (index.embeddings[:DOCS] @ vectors[query]).astype(np.float64)

    def top(scores: dict[int, float], count: int) -> list[int]:
        return sorted(scores, key=lambda d: (-scores[d], d))[:count]

    single = depth if steered else max(case["offset"] + case["k"] + 1, depth)
    if mode == "bm25":
        listed = top({d: bm25[d] for d in admitted if d in bm25}, single)
        scored = {d: bm25[d] for d in listed}
    elif mode == "dense":
        listed = top({d: float(cosine[d]) for d in admitted}, single)
        scored = {d: float(cosine[d]) for d in listed}
    else:
        lex = top({d: bm25[d] for d in admitted if d in bm25}, depth)
        sem = top({d: float(cosine[d]) for d in admitted}, depth)
        pool = sorted(set(lex) | set(sem))
        if case["fusion"] == "rrf":
            scored = {d: sum(1.0 / (60 + ranks.index(d) + 1) for ranks in (lex, sem) if d in ranks) for d in pool}
        else:  # cc: equal weights of the z-scores over the candidates (scores below 0: product mode's |s|)
            z_lex, z_sem = zscores([bm25.get(d, 0.0) for d in pool]), zscores([float(cosine[d]) for d in pool])
            scored = {d: 0.5 * z_sem[i] + 0.5 * z_lex[i] for i, d in enumerate(pool)}
    if case["boosts"]:
        for d, base in list(scored.items()):
            total = sum(b.get("weight", 1.0) * boost_value(b, meta[d]) for b in case["boosts"])
            scored[d] = base + (abs(base) * total if case["boost_mode"] == "product" else total)
    ranked = top(scored, len(scored))
    if case["sort"]:
        vocab = sorted(TAGS)
        ranked.sort(key=lambda d: sort_key(case["sort"], meta[d], scored[d], d, vocab))
    pins = [ids.index(p) for p in dict.fromkeys(case["pinned"]) if p in ids and ids.index(p) in admitted]
    final = pins + [d for d in ranked if d not in pins]
    scores = [scored.get(d, math.nan) for d in final]
    start, stop = case["offset"], case["offset"] + case["k"]
    return [ids[d] for d in final[start:stop]], scores[start:stop], len(final) > stop


# --- the property ----------------------------------------------------------------------------------------------------

boost = (
    st.fixed_dictionaries(
        {"field": st.sampled_from(["price", "popularity", "in_stock"]), "weight": st.sampled_from([-0.5, 0.01, 0.3, 2.0])},
        optional={"modifier": st.sampled_from(["none", "log1p", "ln1p", "sqrt", "square"]), "missing": st.sampled_from([0, 50])},
    )
    | st.fixed_dictionaries(
        {
            "decay": st.sampled_from(["gauss", "exp", "linear"]),
            "field": st.just("published"),
            "origin": st.sampled_from(["2016-06-01", "2022-01-15"]),
            "scale": st.sampled_from(["365d", "90d", "720h"]),
            "weight": st.sampled_from([0.2, 1.0, -0.3]),
        },
        optional={"offset": st.sampled_from(["30d", 0]), "decay_at_scale": st.sampled_from([0.5, 0.2, 0.9])},
    )
    | st.fixed_dictionaries(
        {
            "decay": st.sampled_from(["gauss", "exp", "linear"]),
            "field": st.just("price"),
            "origin": st.sampled_from([0, 250.5]),
            "scale": st.sampled_from([50, 200]),
            "weight": st.sampled_from([0.5, 1.5]),
        }
    )
    | st.fixed_dictionaries({"filter": st.sampled_from(FILTERS[1:]), "weight": st.sampled_from([0.1, 0.7, -0.2])})
)
doc_ids = st.integers(0, DOCS + 5).map(lambda i: f"unknown-{i}" if i >= DOCS else i)
cases = st.fixed_dictionaries(
    {
        "query": st.integers(0, 11),
        "mode": st.sampled_from(["bm25", "dense", "hybrid"]),
        "fusion": st.sampled_from(["rrf", "cc"]),
        "depth": st.sampled_from([10, 30]),
        "filter": st.sampled_from(FILTERS),
        "boosts": st.lists(boost, max_size=3),
        "boost_mode": st.sampled_from(["sum", "product"]),
        "sort": st.lists(st.sampled_from(["price", "price:desc", "published:desc", "tags", "tags:desc", "in_stock", "_score"]), max_size=2),
        "pinned": st.lists(doc_ids, max_size=3),
        "hidden": st.lists(doc_ids, max_size=3),
        "typo": st.sampled_from([0, "auto"]),
        "text_fields": st.sampled_from([None, {"title": 3.0, "text": 1.0}, {"title": 1.0, "text": 0.0}]),
        "offset": st.integers(0, 25),
        "k": st.integers(1, 12),
    }
)


@settings(
    max_examples=int(os.environ.get("STEER_EXAMPLES", 1000)), deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
@given(cases)
def test_steered_search_equals_the_reference(opened, case):
    index, docs, queries, vectors = opened
    ids = [d["_id"] for d in docs]
    case = {**case, "query": queries[case["query"]]}
    for name in ("pinned", "hidden"):
        case[name] = [ids[p] if isinstance(p, int) else p for p in case[name]]
    spec = {
        "mode": case["mode"],
        "depth": case["depth"],
        "typo": case["typo"],
        "text_fields": case["text_fields"],
        "fusion": {"method": case["fusion"]},
        "boost_mode": case["boost_mode"],
    }
    spec |= {"filter": case["filter"], "boosts": case["boosts"], "sort": case["sort"]}
    result = index.pipeline().search(
        case["query"],
        case["k"],
        spec,
        case["offset"],
        vectors[case["query"]],
        curation=Curation(tuple(case["pinned"]), tuple(case["hidden"])),
    )
    want_ids, want_scores, want_more = reference(opened, case)
    page = result.ranking.doc_idx[result.page.start : result.page.stop]
    assert [ids[d] for d in page] == want_ids
    # 1e-6, of the score where a large boost (price squared) made it large: float32 cosines' rounding, multiplied
    np.testing.assert_allclose(result.ranking.scores[result.page.start : result.page.stop], want_scores, rtol=1e-6, atol=1e-6)
    assert result.has_more == want_more
    if result.explainable:  # the explanation adds up: base + each boost's contribution = the final score
        for position in result.page:
            parts = result.explain(position)
            if parts.get("boosted"):
                total = parts["boosted"]["base"] + sum(b["contribution"] for b in parts["boosted"]["boosts"])
                assert total == pytest.approx(parts["final"], abs=1e-6)


# --- checks, rules, writes -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "loc", "message"),
    [
        ({"boosts": [{"field": "tags"}]}, ("boosts", 0, "field"), "not a filterable field of type int, float, bool"),
        ({"boosts": [{"decay": "gauss", "field": "price", "origin": "now", "scale": 5}]}, ("boosts", 0, "origin"), "a number field"),
        ({"boosts": [{"decay": "exp", "field": "published", "origin": 3, "scale": "1d"}]}, ("boosts", 0, "origin"), "a date field"),
        ({"boosts": [{"decay": "exp", "field": "published", "origin": "now"}]}, ("boosts", 0, "scale"), "required"),
        ({"boosts": [{"decay": "exp", "field": "published", "origin": "now", "scale": "0d"}]}, ("boosts", 0, "scale"), "above 0"),
        ({"boosts": [{"decay": "cubic", "field": "price", "origin": 1, "scale": 1}]}, ("boosts", 0, "decay"), "valid: gauss, exp"),
        ({"boosts": [{"field": "price", "decay_at_scale": 0.5}]}, ("boosts", 0, "decay_at_scale"), "unknown field"),
        ({"boosts": [{"field": "price", "modifier": "log"}]}, ("boosts", 0, "modifier"), "valid: none, log1p"),
        ({"boosts": [{"filter": {"colour": "red"}, "weight": 1}]}, ("boosts", 0, "filter", "colour"), "unknown field"),
        ({"boosts": [{"field": "price", "weight": math.inf}]}, ("boosts", 0, "weight"), "finite"),
        ({"boost_mode": "max"}, ("boost_mode",), "valid: sum, product"),
        ({"sort": ["colour"]}, ("sort", 0, "field"), "sortable: _score, in_stock"),
        ({"sort": [{"field": "price", "order": "up"}]}, ("sort", 0, "order"), "valid: asc, desc"),
        ({"sort": "price"}, ("sort",), "must be a list"),
    ],
)
def test_a_bad_boost_or_sort_names_its_path(opened, spec, loc, message):
    index = opened[0]
    with pytest.raises(SpecError, match=message) as caught:
        index.pipeline().resolve(spec)
    assert caught.value.loc == loc


def test_a_boost_that_overflows_is_refused_naming_it(opened):
    index, _, queries, _ = opened
    squared = {"field": "price", "modifier": "square", "missing": 1e308, "weight": 2}  # documents without a price: inf
    with pytest.raises(SpecError, match="overflow to infinity") as caught:
        index.pipeline().search(queries[0], 5, {"boosts": [{"field": "price"}, squared]})
    assert caught.value.loc == ("boosts", 1)


def test_rules_apply_to_their_queries_in_order():
    rules = check_rules(
        [
            {"query": "Vitamin  D", "pinned": ["a", "b"], "hidden": ["x"]},
            {"query": "vitamin", "match": "contains", "pinned": ["b", "c"], "hidden": ["y"]},
        ]
    )
    assert for_query(rules, " vitamin d ") == Curation(("a", "b", "c"), ("x", "y"))
    assert for_query(rules, "vitamin d deficiency") == Curation(("b", "c"), ("y",))  # the first rule is exact
    assert for_query(rules, "vitamins") == Curation()  # whole words only
    assert Curation(("c", "z")).then(for_query(rules, "vitamin d")) == Curation(("c", "z", "a", "b"), ("x", "y"))
    with pytest.raises(SpecError, match="must be a non-empty query") as caught:
        check_rules([{"query": " ", "pinned": ["a"]}])
    assert caught.value.loc == ("curation", 0, "query")
    with pytest.raises(SpecError, match="valid: exact, contains"):
        check_rules([{"query": "x", "match": "prefix", "pinned": ["a"]}])


def test_pins_of_deleted_or_filtered_documents_are_left_out(opened):
    index, docs, queries, _ = opened
    ids = [d["_id"] for d in docs]
    out_of_stock = next(i for i, d in enumerate(docs) if d["metadata"].get("in_stock") is False)
    result = index.pipeline().search(
        queries[0], 5, {"filter": {"in_stock": True}}, curation=Curation((ids[out_of_stock], "no-such-id", ids[3]), (ids[3],))
    )
    assert ids[out_of_stock] not in [ids[d] for d in result.ranking.doc_idx] and result.pinned == ()
    pinned = index.pipeline().search(queries[0], 5, {"mode": "bm25"}, curation=Curation((ids[150],)))
    assert pinned.pinned == (150,) and pinned.ranking.doc_idx[0] == 150
    assert pinned.explain(0)["pinned"] == 1


def test_boosts_on_a_date_field_written_after_the_build_rank_as_a_fresh_build(steer_index, tmp_path):
    from hybrid_retrieval.indexer.build import BuildOptions, build_index
    from hybrid_retrieval.indexer.live.collection import Collection

    _, docs = steer_index
    undated = [{**d, "metadata": {k: v for k, v in d["metadata"].items() if k != "published"}} for d in docs[:60]]
    build_index(write_jsonl(tmp_path / "base.jsonl", undated), tmp_path / "base", BuildOptions(progress=False))
    base = open_index(tmp_path / "base")
    assert "published" not in base.manifest.metadata  # the field comes with the writes
    collection = Collection(base)
    final = {d["_id"]: d for d in undated}
    written = docs[60:80] + docs[10:20]  # new documents, and base documents again with their date
    collection.upsert([{"id": d["_id"], "title": d["title"], "text": d["text"], "metadata": d["metadata"]} for d in written])
    collection.delete([docs[0]["_id"], docs[25]["_id"]])
    final |= {d["_id"]: d for d in written}
    for gone in (docs[0]["_id"], docs[25]["_id"]):
        final.pop(gone)
    view = collection.refresh()
    build_index(write_jsonl(tmp_path / "fresh.jsonl", list(final.values())), tmp_path / "fresh", BuildOptions(progress=False))
    fresh = open_index(tmp_path / "fresh", embedder=base.embedder)
    recency = [{"decay": "gauss", "field": "published", "origin": "2024-01-01", "scale": "700d", "weight": 2.0}]
    specs = [
        {"mode": "bm25", "boosts": recency},
        {"mode": "dense", "boosts": [*recency, {"filter": {"tags": "a"}, "weight": 0.05}], "boost_mode": "product"},
        {"mode": "hybrid", "boosts": recency},
        {"mode": "hybrid", "sort": ["published:desc", "_score"]},
    ]
    live_pipeline, fresh_pipeline = view.pipeline(), fresh.pipeline()
    for query in [d["title"] for d in docs[60:80:4]] + [d["title"] for d in docs[10:20:3]]:
        for spec in specs:
            live, expected = (p.search(query, 20, spec) for p in (live_pipeline, fresh_pipeline))
            assert [view.document(int(i))["id"] for i in live.ranking.doc_idx] == [fresh.doc_ids[i] for i in expected.ranking.doc_idx]
            # float32 BM25 of live statistics: a score of 18 differs from the fresh build's in its 7th digit
            np.testing.assert_allclose(live.ranking.scores, expected.ranking.scores, rtol=1e-7, atol=1e-6)
    collection.close()
