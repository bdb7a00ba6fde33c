"""Languages over HTTP against a real server process: a collection's analyzer settings (checked field by field),
Chinese, Japanese, Korean and mixed documents found by BM25 and highlighted at the right characters, synonyms
changed through PATCH without a rebuild and kept across a compaction and a restart."""

from __future__ import annotations

import httpx
import pytest

from hybrid_retrieval.evaluation.server import running_server

pytestmark = pytest.mark.server  # each test talks to the service (a process, or create_app in this one)

WRITER = {"X-API-Key": "language-writer"}
DOCS = [
    "人工智能技术发展迅速，深度学习改变了计算机视觉。",
    "東京大学の研究者が新しい量子コンピュータを発表した。",
    "서울에서 열린 회의에서 기후 변화 대책이 논의되었다.",
    "The quantum 计算机 (computer) was built in 东京 by researchers.",
    "Maple syrup is made from the sap of maple trees.",
]


def env_for(data) -> dict[str, str]:
    return {"HYBRID_DATA": str(data), "HYBRID_WRITE_KEYS": "language-writer", "HYBRID_REFRESH_INTERVAL": "0.1", "HYBRID_VERIFY": "size"}


def collection(name: str, analyzer: dict) -> dict:
    return {"name": name, "settings": {"embedder": {"kind": "none", "dimension": 4}, "analyzer": analyzer}}


def documents() -> list[dict]:
    return [{"id": f"d{i}", "text": text, "vector": [1.0, float(i), 0.5, -1.0]} for i, text in enumerate(DOCS)]


def bm25_ids(client: httpx.Client, name: str, query: str) -> list[str]:
    """Exact terms only: typo tolerance would match "sirup" to "syrup" without any synonym rule."""
    reply = client.post(f"/collections/{name}/search", json={"query": query, "mode": "bm25", "typo": 0})
    assert reply.status_code == 200, reply.text
    return [hit["id"] for hit in reply.json()["hits"]]


@pytest.mark.parametrize(
    ("analyzer", "field"),
    [
        ({"language": "klingon"}, "settings.analyzer.language"),
        ({"cjk": "mecab"}, "settings.analyzer.cjk"),
        ({"stopwords": []}, "settings.analyzer.stopwords"),
        ({"fold_accents": "yes"}, "settings.analyzer.fold_accents"),
    ],
)
def test_analyzer_settings_are_checked_field_by_field(server, analyzer, field):
    _url, client = server
    reply = client.post("/collections", json=collection("refused", analyzer))
    assert reply.status_code == 422, reply.text
    assert any(field in ".".join(map(str, error["loc"])) for error in reply.json()["detail"]), reply.text


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    data = tmp_path_factory.mktemp("languages") / "data"
    with running_server(None, env_for(data)) as (url, _), httpx.Client(base_url=url, headers=WRITER, timeout=60) as client:
        yield url, client


def test_cjk_collections_find_highlight_and_take_synonyms(server, tmp_path):
    _url, client = server
    created = client.post("/collections", json=collection("news", {"language": "zh", "normalization": "nfkc"}))
    assert created.status_code == 201, created.text
    analyzer = created.json()["settings"]["analyzer"]
    assert (analyzer["stemmer"], analyzer["stopwords"], analyzer["cjk"], analyzer["normalization"]) == ("none", "none", "bigram", "nfkc")
    assert client.put("/collections/news/documents?wait=true", json={"documents": documents()}).status_code == 200
    assert client.post("/collections", json=collection("legacy", {"cjk": "none"})).status_code == 201
    assert client.put("/collections/legacy/documents?wait=true", json={"documents": documents()}).status_code == 200

    for query, expected in [("人工智能", "d0"), ("量子コンピュータ", "d1"), ("회의", "d2"), ("计算机", "d3"), ("ｍａｐｌｅ", "d4")]:
        assert bm25_ids(client, "news", query)[0] == expected, query
    assert bm25_ids(client, "legacy", "人工智能") == []  # one token a run, as before: nothing matches

    reply = client.post("/collections/news/search", json={"query": "计算机", "mode": "bm25", "highlight": {"enabled": True}})
    hit = reply.json()["hits"][0]
    (snippet,) = hit["highlight"]["text"]
    assert "<mark>计算机</mark>" in snippet["text"]
    assert [DOCS[3][s:e] for s, e in snippet["matches"]] == ["计算机"]

    # synonyms: refused by name when bad, served at once when good, no rebuild
    bad = client.patch("/collections/news/settings", json={"synonyms": [{"equivalent": ["ai"]}]})
    assert bad.status_code == 422 and "synonyms" in bad.text
    assert bm25_ids(client, "news", "AI") == []
    changed = client.patch("/collections/news/settings", json={"synonyms": [{"from": "AI", "to": ["人工智能"]}]})
    assert changed.status_code == 200, changed.text
    assert changed.json()["settings"]["synonyms"] == [{"from": ["AI"], "to": ["人工智能"]}]
    assert bm25_ids(client, "news", "AI") == ["d0"]
    assert client.get("/collections/news/stats").json()["documents"] == len(DOCS)
    # a compaction builds a new base: the rules come with it
    assert client.post("/collections/news/compact").status_code == 200
    assert bm25_ids(client, "news", "AI") == ["d0"]


def test_synonyms_survive_a_restart(tmp_path):
    data = tmp_path / "data"
    with running_server(None, env_for(data)) as (url, _), httpx.Client(base_url=url, headers=WRITER, timeout=60) as client:
        assert client.post("/collections", json=collection("notes", {"language": "en"})).status_code == 201
        assert client.put("/collections/notes/documents?wait=true", json={"documents": documents()}).status_code == 200
        rules = [{"equivalent": ["sirup", "syrup"]}]
        assert client.patch("/collections/notes/settings", json={"synonyms": rules}).status_code == 200
        assert bm25_ids(client, "notes", "sirup") == ["d4"]
    with running_server(None, env_for(data)) as (url, _), httpx.Client(base_url=url, headers=WRITER, timeout=60) as client:
        assert bm25_ids(client, "notes", "sirup") == ["d4"]
        assert client.patch("/collections/notes/settings", json={"synonyms": []}).status_code == 200
        assert bm25_ids(client, "notes", "sirup") == []
