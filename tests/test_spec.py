"""The search spec: one validation, a dict form and a string form that round-trip, merging by layers."""

import math

import pytest
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st

from hybrid_retrieval.app.main import create_app
from hybrid_retrieval.app.settings import Settings
from hybrid_retrieval.common.errors import SpecError
from hybrid_retrieval.indexer.store import open_index
from hybrid_retrieval.search.boosts import BOOST_MODES, DECAYS, check_boosts
from hybrid_retrieval.search.fields import check_text_fields
from hybrid_retrieval.search.fusion import MAX_RRF_WEIGHT, RRF, ConvexCombination
from hybrid_retrieval.search.highlight import SNIPPET_CHARS_RANGE, SNIPPETS_RANGE
from hybrid_retrieval.search.hubness import HUBNESS_METHODS
from hybrid_retrieval.search.normalize import NORMALIZERS
from hybrid_retrieval.search.rerank import MAX_RERANK_DEPTH
from hybrid_retrieval.search.sorting import check_sort
from hybrid_retrieval.search.spec import (
    MAX_DEPTH,
    MODES,
    HighlightSpec,
    HubnessSpec,
    RerankSpec,
    SearchSpec,
    parse_spec_string,
    spec_to_string,
)
from hybrid_retrieval.search.typo import TYPO_CHOICES
from tests.conftest import LengthScorer

unit = st.floats(0, 1, allow_nan=False)
fusions = st.one_of(
    st.builds(RRF, rrf_k=st.floats(0, 1e6, allow_nan=False), weights=st.tuples(st.floats(0, MAX_RRF_WEIGHT), st.floats(0, MAX_RRF_WEIGHT))),
    st.builds(ConvexCombination, alpha=unit, norm=st.sampled_from(list(NORMALIZERS))),
)
specs = st.builds(
    SearchSpec,
    mode=st.sampled_from(MODES),
    depth=st.integers(1, MAX_DEPTH),
    fusion=fusions,
    hubness=st.sampled_from(HUBNESS_METHODS).flatmap(
        lambda method: st.builds(HubnessSpec, st.just(method), st.booleans() if method != "none" else st.just(False))
    ),
    rerank=st.builds(RerankSpec, enabled=st.booleans(), depth=st.integers(1, MAX_RERANK_DEPTH), weight=unit),
    min_score=st.none() | st.floats(-1e300, 1e300, allow_nan=False),
    filter=st.none()
    | st.dictionaries(
        st.text(min_size=1).filter(lambda s: not s.startswith("$")),
        st.integers() | st.text() | st.dictionaries(st.sampled_from(["gte", "in"]), st.integers()),
        min_size=1,
        max_size=3,
    ),
    highlight=st.builds(
        HighlightSpec,
        enabled=st.booleans(),
        semantic=st.booleans(),
        snippet_chars=st.integers(*SNIPPET_CHARS_RANGE),
        snippets=st.integers(*SNIPPETS_RANGE),
    ),
    typo=st.sampled_from(TYPO_CHOICES),
    boosts=st.lists(
        st.fixed_dictionaries({"field": st.sampled_from(["year", "a+b"]), "weight": st.floats(-5, 5)})
        | st.fixed_dictionaries(
            {
                "decay": st.sampled_from(DECAYS),
                "field": st.just("published"),
                "origin": st.sampled_from(["now", "2020-01-01"]),
                "scale": st.sampled_from(["30d", 7, 0.5]),
            }
        )
        | st.fixed_dictionaries({"filter": st.just({"tags": "a+b"}), "weight": st.floats(-1, 1)}),
        max_size=3,
    ).map(check_boosts),
    boost_mode=st.sampled_from(BOOST_MODES),
    sort=st.lists(st.sampled_from(["price", "price:desc", "_score", "a:b"]), max_size=3).map(check_sort),
    text_fields=st.none() | st.sampled_from([{"title": 3}, {"title": 0.5, "text": 1}, {"text": 2}]).map(check_text_fields),
)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(specs)
def test_spec_survives_dict_string_dict(spec):
    as_dict = spec.to_dict()
    assert SearchSpec.from_dict(as_dict) == spec
    text = spec_to_string(as_dict)
    assert SearchSpec.from_dict(parse_spec_string(text)).to_dict() == as_dict
    assert spec.to_string() == text


def test_string_form_examples():
    spec = SearchSpec.from_dict(parse_spec_string("dense+cc:zscore:0.45+depth:7+qbnorm:dis+rerank:d=20:w=0.35+min:-0.5"))
    assert spec == SearchSpec(
        mode="dense",
        depth=7,
        fusion=ConvexCombination(alpha=0.45, norm="zscore"),
        hubness=HubnessSpec("qbnorm", True),
        rerank=RerankSpec(True, 20, 0.35),
        min_score=-0.5,
    )
    assert SearchSpec().to_string() == "hybrid+cc:zscore:0.5+depth:100+nohub+rerank:off:d=50:w=1"
    assert parse_spec_string("rrf:60:w=1,0.5") == {"mode": "hybrid", "fusion": {"method": "rrf", "rrf_k": 60.0, "weights": [1.0, 0.5]}}
    assert parse_spec_string("bm25+rerank") == {"mode": "bm25", "rerank": {"enabled": True}}
    assert parse_spec_string("bm25+typo:0") == {"mode": "bm25", "typo": 0}
    assert parse_spec_string("hybrid+typo:auto") == {"mode": "hybrid", "typo": "auto"}
    with pytest.raises(SpecError, match="typo: must be one of 'auto', 0, 1, 2, got 3"):
        parse_spec_string("bm25+typo:3")


def test_dynamic_without_a_correction_is_plain_no_correction():
    spec = SearchSpec().merge({"hubness": {"method": "none", "dynamic": True}})
    assert spec.hubness == HubnessSpec() and SearchSpec.from_dict(parse_spec_string(spec.to_string())) == spec


def test_merge_applies_layers_field_by_field():
    index = SearchSpec(fusion=ConvexCombination(alpha=0.45, norm="zscore"), hubness=HubnessSpec("dbnorm"))
    service = index.merge({"rerank": {"enabled": True, "depth": 30, "weight": 0.5}})
    request = service.merge({"mode": "dense", "fusion": {"alpha": 0.2}, "rerank": {"weight": 1.0}, "hubness": {"dynamic": True}})
    assert request == SearchSpec(
        mode="dense",
        fusion=ConvexCombination(alpha=0.2, norm="zscore"),
        hubness=HubnessSpec("dbnorm", True),
        rerank=RerankSpec(True, 30, 1.0),
    )
    assert service.merge({"fusion": {"method": "rrf"}}).fusion == RRF()  # another method: its own defaults
    assert service.merge(None) is service and service.merge({}) is service


INVALID = [
    ({"mode": "semantic"}, "mode", "unknown value 'semantic'; valid: bm25, dense, hybrid"),
    ({"depth": 0}, "depth", "must be between 1 and 1000, got 0"),
    ({"depth": 2.5}, "depth", "must be an integer"),
    ({"depth": True}, "depth", "must be an integer"),
    ({"fusion": {"method": "borda"}}, "fusion.method", "unknown fusion method 'borda'; valid: rrf, cc"),
    ({"fusion": {"method": "rrf", "rrf_k": -1}}, "fusion.rrf_k", "must be between 0 and 1000000"),
    ({"fusion": {"method": "rrf", "weights": [1, -2]}}, "fusion.weights", "must be between 0 and 1000000, got -2"),
    ({"fusion": {"method": "rrf", "rrf_k": 0, "weights": [1.7e308, 1]}}, "fusion.weights", "must be between 0 and 1000000"),
    ({"fusion": {"method": "rrf", "alpha": 0.5}}, "fusion.alpha", "not a field of rrf fusion; valid: rrf_k, weights"),
    ({"fusion": {"method": "cc", "alpha": 1.5}}, "fusion.alpha", "must be between 0 and 1, got 1.5"),
    ({"fusion": {"method": "cc", "norm": "l2"}}, "fusion.norm", "unknown value 'l2'; valid: minmax, zscore, tmm, dbsf, none"),
    ({"hubness": {"method": "csls"}}, "hubness.method", "unknown value 'csls'; valid: none, qbnorm, dbnorm"),
    ({"hubness": {"dynamic": "yes"}}, "hubness.dynamic", "must be true or false"),
    ({"hubness": {"beta": 3}}, "hubness.beta", "unknown field; valid: method, dynamic"),
    ({"depth": 10**400}, "depth", "must be a finite number"),
    ({"rerank": {"depth": -(10**400)}}, "rerank.depth", "must be a finite number"),
    ({"rerank": {"enabled": 1}}, "rerank.enabled", "must be true or false"),
    ({"rerank": {"depth": 201}}, "rerank.depth", "must be between 1 and 200, got 201"),
    ({"rerank": {"weight": -0.1}}, "rerank.weight", "must be between 0 and 1, got -0.1"),
    ({"rerank": {"weight": math.nan}}, "rerank.weight", "must be a finite number"),
    ({"min_score": math.inf}, "min_score", "must be a finite number"),
    ({"min_score": "high"}, "min_score", "must be a number"),
    ({"top_k": 5}, "top_k", "unknown field; valid: mode, depth, fusion, hubness, rerank, min_score"),
]


@pytest.mark.parametrize(("overrides", "field", "message"), INVALID)
def test_every_invalid_field_is_named(overrides, field, message):
    with pytest.raises(SpecError) as err:
        SearchSpec().merge(overrides)
    assert err.value.field == field and message in str(err.value)


@pytest.fixture(scope="module")
def client(tiny_index):
    app = create_app(Settings(rerank_by_default=False), index=open_index(tiny_index), cross_encoder=LengthScorer())
    with TestClient(app) as c:
        yield c


def _json_safe(value) -> bool:
    if isinstance(value, dict):
        return all(map(_json_safe, value.values()))
    return not (isinstance(value, float) and not math.isfinite(value))


@pytest.mark.parametrize(("overrides", "field", "message"), [case for case in INVALID if _json_safe(case[0])])
@pytest.mark.server
def test_every_invalid_field_answers_422_naming_it(client, overrides, field, message):
    response = client.post("/search", json={"query": "cats", **overrides})
    assert response.status_code == 422, response.text
    detail = response.json()["detail"][0]
    parts = field.split(".")  # pydantic's union errors put the fusion method in the path, or name the tag in the message
    assert detail["loc"][:2] == ["body", parts[0]] and (parts[-1] in detail["loc"] or parts[-1] in detail["msg"]), detail


@pytest.mark.server
def test_non_finite_numbers_answer_422_naming_the_field(client):
    for body, loc in [
        ('{"query": "cats", "min_score": Infinity}', ["body", "min_score"]),
        ('{"query": "cats", "rerank": {"weight": NaN}}', ["body", "rerank", "weight"]),
    ]:
        response = client.post("/search", content=body, headers={"content-type": "application/json"})
        assert response.status_code == 422 and response.json()["detail"][0]["loc"] == loc, response.text


@pytest.mark.server
def test_unservable_spec_answers_422(client):
    response = client.post("/search", json={"query": "cats", "hubness": {"method": "qbnorm"}})
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["body", "hubness", "method"]
    assert "no fitted hubness correction" in response.json()["detail"][0]["msg"]


@pytest.mark.server
def test_response_echoes_the_applied_spec(client):
    body = client.post(
        "/search", json={"query": "cats", "k": 3, "fusion": {"method": "cc", "alpha": 0.3}, "rerank": {"enabled": True, "depth": 4}}
    ).json()
    assert body["spec"] == {
        "mode": "hybrid",
        "depth": 100,
        "fusion": {"method": "cc", "alpha": 0.3, "norm": "zscore"},
        "hubness": {"method": "none", "dynamic": False},
        "rerank": {"enabled": True, "depth": 4, "weight": 1.0},
        "min_score": None,
        "filter": None,
        "highlight": {"enabled": False, "semantic": False, "snippet_chars": 160, "snippets": 1},
        "passage_scoring": {"aggregation": "max", "temperature": 0.05, "top": 3, "bm25": "document"},
        "typo": "auto",
        "boosts": [],
        "boost_mode": "sum",
        "sort": [],
        "text_fields": None,
    }
    assert body["reranker"] == "LengthScorer"
    ready = client.get("/ready").json()
    assert SearchSpec.from_dict(ready["defaults"]) == SearchSpec()


def test_settings_are_checked_by_the_spec():
    with pytest.raises(ValueError, match="rerank.weight: must be between 0 and 1, got 1.5"):
        Settings(rerank_weight=1.5)
    with pytest.raises(ValueError, match="depth: must be between 1 and 1000"):
        Settings(depth=5000)


@pytest.mark.server
def test_a_misspelt_word_finds_its_documents_and_explain_names_the_variant(client):
    asked = {"query": "qubts", "mode": "bm25", "explain": True}
    body = client.post("/search", json=asked).json()
    assert [hit["id"] for hit in body["hits"]] == ["d3"]
    assert body["typos"] == {"qubt": [{"term": "qubit", "edits": 1}]}  # analysed terms: "qubits" is stemmed
    off = client.post("/search", json={**asked, "typo": 0}).json()
    assert off["hits"] == [] and off["typos"] == {} and off["spec"]["typo"] == 0
    assert client.post("/search", json={"query": "qubts", "mode": "bm25"}).json()["typos"] is None  # without explain
    response = client.post("/search", json={"query": "qubts", "typo": 3})
    assert response.status_code == 422 and response.json()["detail"][0]["loc"] == ["body", "typo"]
    marked = client.post("/search", json={"query": "qubts", "mode": "bm25", "highlight": True}).json()["hits"][0]["highlight"]
    assert marked["text"][0]["terms"] == ["qubit"] and "<mark>qubits</mark>" in marked["text"][0]["text"]  # the variant's
    exact = client.post("/search", json={"query": "qubts computing", "typo": 0, "highlight": True}).json()["hits"][0]["highlight"]
    assert exact["text"][0]["terms"] == ["comput"]  # typo 0: the misspelt word marks nothing
