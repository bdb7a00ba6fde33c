import json
import re
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from hybrid_retrieval.app.main import create_app
from hybrid_retrieval.app.settings import Settings
from hybrid_retrieval.evaluation.server import running_server
from hybrid_retrieval.indexer.corpus import read_corpus, split_queries

pytestmark = pytest.mark.server  # each test talks to the service (a process, or create_app in this one)


@pytest.fixture(scope="module")
def client(scifact_slice_index):
    with TestClient(create_app(Settings(index=scifact_slice_index))) as c:
        yield c


@pytest.fixture(scope="module")
def judged_in_slice(scifact, scifact_slice):
    """Test queries whose relevant documents are all inside the 500-document slice."""
    ids = {d.doc_id for d in read_corpus(scifact_slice)}
    queries, qrels = split_queries(scifact, "test")
    return [(queries[q], set(rel)) for q, rel in qrels.items() if set(rel) <= ids]


def test_health_and_ready(client):
    assert client.get("/health").json() == {"status": "ok"}
    ready = client.get("/ready").json()
    assert ready["ready"] is True and ready["documents"] == 500


@pytest.mark.parametrize("mode", ["bm25", "dense", "hybrid"])
def test_search_finds_judged_documents(client, judged_in_slice, mode):
    assert len(judged_in_slice) >= 10
    found = 0
    for query, relevant in judged_in_slice:
        body = client.post("/search", json={"query": query, "k": 10, "mode": mode}).json()
        ranks = [h["rank"] for h in body["hits"]]
        assert ranks == list(range(1, len(ranks) + 1))
        assert [h["score"] for h in body["hits"]] == sorted((h["score"] for h in body["hits"]), reverse=True)
        found += bool(relevant & {h["id"] for h in body["hits"]})
    # On this slice every mode puts a relevant document in the top 10 for most judged queries.
    assert found / len(judged_in_slice) >= 0.7


def test_response_shape_text_flag_and_timings(client):
    body = client.post("/search", json={"query": "vitamin D and bone density", "k": 3}).json()
    assert body["spec"]["mode"] == "hybrid" and len(body["hits"]) == 3
    assert all(h["text"] is None and h["title"] for h in body["hits"])
    assert {"bm25", "embed", "dense", "fusion", "total"} <= set(body["timings_ms"])
    with_text = client.post("/search", json={"query": "vitamin D and bone density", "k": 3, "include_text": True}).json()
    assert all(h["text"] for h in with_text["hits"])
    assert [h["id"] for h in with_text["hits"]] == [h["id"] for h in body["hits"]]


@pytest.mark.parametrize("fusion", [None, {"method": "rrf"}])
def test_hybrid_scores_do_not_depend_on_k(client, fusion):
    request = {"query": "cancer cell proliferation"} | ({"fusion": fusion} if fusion else {})
    small = client.post("/search", json=request | {"k": 5}).json()["hits"]
    large = client.post("/search", json=request | {"k": 50}).json()["hits"]
    assert [(h["id"], h["score"]) for h in large[:5]] == [(h["id"], h["score"]) for h in small]
    if fusion:
        assert small[0]["score"] <= 2 / 61 + 1e-9  # at best rank 1 in both legs


def test_unknown_words_give_empty_bm25_hits(client):
    assert client.post("/search", json={"query": "zzqxv", "mode": "bm25"}).json()["hits"] == []


@pytest.mark.parametrize(
    "payload, field",
    [
        ({"query": ""}, "query"),
        ({"query": "   \t "}, "query"),
        ({"query": "x" * 5000}, "query"),
        ({"query": "ok", "k": 0}, "k"),
        ({"query": "ok", "k": 1001}, "k"),
        ({"query": "ok", "k": "ten"}, "k"),
        ({"query": "ok", "mode": "magic"}, "mode"),
        ({"query": "ok", "depth": 0}, "depth"),
        ({"query": "ok", "color": "red"}, "color"),
        ({"query": "bad\x00byte"}, "query"),
        ({"query": "bell\x07"}, "query"),
        ({"k": 3}, "query"),
    ],
)
def test_bad_input_is_422_naming_the_field(client, payload, field):
    response = client.post("/search", json=payload)
    assert response.status_code == 422
    assert any(field in err["loc"] for err in response.json()["detail"]), response.json()


def test_non_utf8_body_is_422_naming_the_byte(client):
    response = client.post("/search", content=b'{"query": "caf\xe9"}', headers={"content-type": "application/json"})
    assert response.status_code == 422 and response.json()["detail"][0]["loc"] == ["body"]
    assert "not UTF-8 (byte 14)" in response.json()["detail"][0]["msg"]


def test_tab_and_newline_are_fine_in_queries(client):
    assert client.post("/search", json={"query": "vitamin\tD\nbone"}).status_code == 200


def test_malformed_json_and_oversize_body(client):
    response = client.post("/search", content=b'{"query": ', headers={"content-type": "application/json"})
    assert response.status_code == 422
    response = client.post("/search", content=b'{"query": "' + b"a" * 100_000 + b'"}', headers={"content-type": "application/json"})
    assert response.status_code == 413 and "exceeds" in response.json()["detail"]


def test_openapi_schema_documents_search(client):
    schema = client.get("/openapi.json").json()
    search = schema["paths"]["/search"]["post"]
    assert "SearchResponse" in json.dumps(search["responses"]["200"])
    assert "rrf_k" in json.dumps(schema["components"]["schemas"]["RRFBody"])
    assert "SearchRequest" in schema["components"]["schemas"]


def test_every_request_body_in_the_schema_has_an_example(client):
    schema = client.get("/openapi.json").json()
    components = schema["components"]["schemas"]

    def has_example(node, seen=()) -> bool:
        if isinstance(node, dict):
            if "example" in node or "examples" in node:
                return True
            name = node.get("$ref", "").rsplit("/", 1)[-1]
            if name:
                return name not in seen and has_example(components[name], (*seen, name))
            return any(has_example(value, seen) for value in node.values())
        return isinstance(node, list) and any(has_example(value, seen) for value in node)

    bodies = {
        f"{method.upper()} {path}": op["requestBody"]
        for path, ops in schema["paths"].items()
        for method, op in ops.items()
        if "requestBody" in op
    }
    assert len(bodies) >= 11 and "POST /collections" in bodies and "PUT /collections/{name}/documents" in bodies
    assert [route for route, body in bodies.items() if not has_example(body)] == []


def test_hybrid_serve_answers_over_loopback(scifact_slice_index):
    with running_server(scifact_slice_index) as (url, _):
        hits = httpx.post(f"{url}/search", json={"query": "vitamin D deficiency", "k": 5}, timeout=10).json()["hits"]
        assert len(hits) == 5 and all(h["id"] for h in hits)


def test_readme_quickstart_is_true(client):
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    commands = re.findall(r"^bash (scripts/\S+)", readme, flags=re.M)
    assert commands[:2] == ["scripts/run.sh", "scripts/test.sh"]
    assert all((Path(__file__).resolve().parents[1] / c).is_file() for c in commands)
    body = json.loads(re.search(r"-d '(\{.*?\})'", readme).group(1))
    response = client.post("/search", json=body)
    assert response.status_code == 200 and len(response.json()["hits"]) == body["k"]


QUERY = "cancer cell proliferation and apoptosis"


def test_explain_rrf_components_reproduce_the_fused_score(client):
    body = client.post(
        "/search", json={"query": QUERY, "k": 20, "explain": True, "fusion": {"method": "rrf", "rrf_k": 30, "weights": [0.7, 1.3]}}
    ).json()
    assert body["spec"]["fusion"] == {"method": "rrf", "rrf_k": 30.0, "weights": [0.7, 1.3]}
    for hit in body["hits"]:
        e = hit["explain"]
        expected = sum(w / (30 + e[name]["rank"]) for name, w in (("bm25", 0.7), ("dense", 1.3)) if e[name]["rank"])
        assert hit["score"] == pytest.approx(expected, abs=1e-6) and e["fused"] == pytest.approx(expected, abs=1e-6)
        assert e["bm25"]["score"] >= 0 and -1 <= e["dense"]["score"] <= 1


@pytest.mark.parametrize("norm", ["minmax", "zscore", "tmm", "dbsf", "none"])
def test_explain_cc_components_reproduce_the_fused_score(client, norm):
    body = client.post(
        "/search", json={"query": QUERY, "k": 20, "explain": True, "fusion": {"method": "cc", "alpha": 0.3, "norm": norm}}
    ).json()
    for hit in body["hits"]:
        e = hit["explain"]
        expected = 0.3 * e["dense"]["normalized"] + 0.7 * e["bm25"]["normalized"]
        assert hit["score"] == pytest.approx(expected, abs=1e-6)
        assert e["dense"]["contribution"] + e["bm25"]["contribution"] == pytest.approx(hit["score"], abs=1e-6)
    if norm == "none":
        e = body["hits"][0]["explain"]
        assert e["bm25"]["normalized"] == pytest.approx(e["bm25"]["score"])


@pytest.mark.parametrize("fusion", [{"method": "rrf"}, {"method": "cc", "alpha": 0.6, "norm": "zscore"}])
def test_fused_scores_do_not_change_with_k(client, fusion):
    small = client.post("/search", json={"query": QUERY, "k": 3, "fusion": fusion}).json()["hits"]
    large = client.post("/search", json={"query": QUERY, "k": 100, "fusion": fusion}).json()["hits"]
    assert [(h["id"], h["score"]) for h in large[:3]] == [(h["id"], h["score"]) for h in small]


def test_min_score_applies_after_fusion(client):
    hits = client.post("/search", json={"query": QUERY, "k": 50, "fusion": {"method": "cc", "alpha": 0.5}}).json()["hits"]
    cut = hits[4]["score"]
    kept = client.post("/search", json={"query": QUERY, "k": 50, "fusion": {"method": "cc", "alpha": 0.5}, "min_score": cut}).json()["hits"]
    assert [h["id"] for h in kept] == [h["id"] for h in hits if h["score"] >= cut]


@pytest.mark.parametrize(
    "fusion, field",
    [
        ({"method": "borda"}, "fusion"),
        ({"method": "cc", "alpha": 1.5}, "alpha"),
        ({"method": "cc", "norm": "softmax"}, "norm"),
        ({"method": "rrf", "rrf_k": -1}, "rrf_k"),
        ({"method": "rrf", "weights": [1]}, "weights"),
        ({"method": "rrf", "k": 60}, "k"),
    ],
)
def test_bad_fusion_is_422_naming_the_field(client, fusion, field):
    response = client.post("/search", json={"query": "ok", "fusion": fusion})
    assert response.status_code == 422
    assert any(field in map(str, err["loc"]) for err in response.json()["detail"]), response.json()


def test_nan_parameters_are_rejected(client):
    raw = b'{"query": "ok", "fusion": {"method": "cc", "alpha": NaN}}'
    response = client.post("/search", content=raw, headers={"content-type": "application/json"})
    assert response.status_code == 422
    raw = b'{"query": "ok", "min_score": Infinity}'
    assert client.post("/search", content=raw, headers={"content-type": "application/json"}).status_code == 422


def test_the_api_docs_load_nothing_from_outside(client):
    page = client.get("/docs")
    assert page.status_code == 200
    sources = re.findall(r'(?:src|href)="([^"]+)"|url: ?[\'"]([^\'"]+)', page.text)
    urls = [url for pair in sources for url in pair if url]
    assert urls and all(url.startswith("/") for url in urls), urls  # this service's own paths only
    for url in urls:
        assert client.get(url).status_code == 200, url
    assert b"SwaggerUIBundle" in client.get("/docs/assets/swagger-ui-bundle.js").content
    assert client.get("/docs/assets/nope.js").status_code == 404
