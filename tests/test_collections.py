"""Collections end to end, against a real server process: an empty start, a collection created and bulk-loaded
through the API that ranks exactly like an offline build of the same documents, aliases swapped under load, drops,
and a restart that keeps everything."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import threading
import time

import httpx
import numpy as np
import pytest

from hybrid_retrieval.evaluation.server import running_server
from hybrid_retrieval.indexer.store import stored_vectors
from hybrid_retrieval.models.embedder import OnnxEmbedder
from tests.conftest import sample_queries, with_metadata

pytestmark = pytest.mark.server  # each test talks to the service (a process, or create_app in this one)

WRITER = {"X-API-Key": "lifecycle-writer"}
FILTERABLE = ["flag", "tags", "year"]
SETTINGS = {"filterable": FILTERABLE, "bm25": {"k1": 1.2, "b": 0.75}}


KEYS_FILE = """# key        role   collections and aliases
lifecycle-writer
app-key      write  scifact
viewer       read   scifact-offline
"""


def env_for(data) -> dict[str, str]:
    keys = data.parent / "keys.txt"
    keys.write_text(KEYS_FILE)
    return {"HYBRID_DATA": str(data), "HYBRID_WRITE_KEYS_FILE": str(keys), "HYBRID_REFRESH_INTERVAL": "0.2", "HYBRID_VERIFY": "size"}


def documents(scifact, count: int) -> list[dict]:
    with (scifact / "corpus.jsonl").open() as fh:
        docs = [with_metadata(i, json.loads(line)) for i, line in enumerate(itertools.islice(fh, count))]
    return [{"id": d["_id"], "title": d["title"], "text": d["text"], "metadata": d["metadata"]} for d in docs]


def wait_for(check, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def load(client: httpx.Client, name: str, docs: list[dict], per_request: int | None = None) -> list[dict]:
    """A bulk load through the API, as NDJSON with ?wait=false, `per_request` documents a request (a body is at most
    16 MiB, which 2,000 documents with 384-number vectors exceed), each task finished before the next request so the
    documents keep their order: the finished tasks."""
    per_request = per_request or len(docs)
    tasks = []
    for start in range(0, len(docs), per_request):
        body = "".join(json.dumps(d) + "\n" for d in docs[start : start + per_request])
        response = client.put(f"/collections/{name}/documents?wait=false", content=body, headers={"Content-Type": "application/x-ndjson"})
        assert response.status_code == 202, response.text
        task_id = response.json()["id"]
        assert response.headers["location"] == f"/tasks/{task_id}"

        def finished(task_id: str = task_id):
            task = client.get(f"/tasks/{task_id}").json()
            return task if task["state"] not in ("queued", "running") else None

        tasks.append(wait_for(finished, 600, f"task {task_id}"))
    return tasks


def build_offline(corpus, data, name: str) -> None:
    command = [sys.executable, "-m", "hybrid_retrieval.cli", "index", str(corpus), "--collection", name, "--data", str(data)]
    command += ["--filterable", ",".join(FILTERABLE), "--k1", "1.2", "--exact-below", "10000", "--quiet"]
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


SEARCHES = [
    {"mode": "bm25"},
    {"mode": "dense"},
    {"mode": "hybrid"},
    {"mode": "hybrid", "offset": 10},
    {"mode": "hybrid", "filter": {"year": {"gte": 2005}, "flag": True}},
    {"mode": "dense", "filter": {"tags": "b"}, "offset": 5},
]


def assert_same_rankings(client: httpx.Client, a: str, b: str, queries: list[str]) -> None:
    for query, search in itertools.product(queries, SEARCHES):
        body = {"query": query, "k": 10, **search}
        left, right = (client.post(f"/collections/{name}/search", json=body) for name in (a, b))
        assert left.status_code == right.status_code == 200, (left.text, right.text)
        left_hits, right_hits = left.json()["hits"], right.json()["hits"]
        assert [h["id"] for h in left_hits] == [h["id"] for h in right_hits], (query, search)
        np.testing.assert_allclose([h["score"] for h in left_hits], [h["score"] for h in right_hits], atol=1e-5)
        assert left.json()["has_more"] == right.json()["has_more"]


def assert_same_vector_rankings(client: httpx.Client, a: str, b: str, queries: list[str], embedder) -> None:
    for query, vector in zip(queries, embedder.encode(queries)):
        for search in ({"mode": "dense"}, {"mode": "dense", "filter": {"flag": False}, "offset": 3}, {"mode": "hybrid", "query": query}):
            body = {"vector": vector.tolist(), "k": 10, **search}
            left, right = (client.post(f"/collections/{name}/search", json=body) for name in (a, b))
            assert left.status_code == right.status_code == 200, (left.text, right.text)
            assert [h["id"] for h in left.json()["hits"]] == [h["id"] for h in right.json()["hits"]], (query, search)
            np.testing.assert_allclose([h["score"] for h in left.json()["hits"]], [h["score"] for h in right.json()["hits"]], atol=1e-5)


def search_under_load(url: str, alias: str, queries: list[str], stop: threading.Event, outcomes: list) -> None:
    with httpx.Client(base_url=url, timeout=30, headers=WRITER) as client:
        for query in itertools.cycle(queries):
            if stop.is_set():
                return
            try:
                response = client.post(f"/collections/{alias}/search", json={"query": query, "k": 5})
                outcomes.append(response.status_code)
            except httpx.TransportError as exc:
                outcomes.append(repr(exc))


def lifecycle(scifact, tmp_path, count: int) -> None:
    data = tmp_path / "data"
    docs = documents(scifact, count)
    # one file for both ways in: BEIR's `_id`, and metadata as top-level fields on some lines, an object on others
    corpus = tmp_path / "corpus.jsonl"
    lines = [
        {"_id": d["id"], "title": d["title"], "text": d["text"], **({"metadata": d["metadata"]} if i % 2 else d["metadata"])}
        for i, d in enumerate(docs)
    ]
    corpus.write_text("".join(json.dumps(line) + "\n" for line in lines))
    queries = sample_queries(scifact, 8, 0)
    with running_server(None, env_for(data)) as (url, _), httpx.Client(base_url=url, timeout=120, headers=WRITER) as client:
        assert client.get("/collections").json() == {"collections": []}  # an empty start
        assert client.post("/search", json={"query": "x"}).status_code == 404  # no default collection yet

        created = client.post("/collections", json={"name": "scifact-v1", "settings": SETTINGS})
        assert created.status_code == 201, created.text
        assert created.json()["documents"] == 0 and created.json()["settings"]["filterable"] == FILTERABLE
        assert client.post("/collections", json={"name": "scifact-v1"}).status_code == 409
        invalid = client.post("/collections", json={"name": "x", "settings": {"vectors": {"kind": "ivfpq", "pq_m": 7}}})
        assert invalid.status_code == 422 and invalid.json()["detail"][0]["loc"] == ["body", "settings", "vectors", "pq_m"]

        (task,) = load(client, "scifact-v1", lines)  # the file's own lines
        assert task["state"] == "succeeded" and task["documents_done"] == count and task["documents_per_second"] > 0
        wait_for(lambda: client.get("/collections/scifact-v1").json()["documents"] == count, 30, "the load to be searchable")

        build_offline(corpus, data, "scifact-offline")  # the server serves it within a refresh interval
        wait_for(lambda: client.get("/collections/scifact-offline").status_code == 200, 30, "the offline build to be served")
        assert_same_rankings(client, "scifact-v1", "scifact-offline", queries)

        # bring your own vectors: a collection without a model, filled with the offline build's document vectors,
        # answers dense (and hybrid) searches given the same query vectors exactly as the offline build does
        own = {"name": "scifact-vectors", "settings": {**SETTINGS, "embedder": {"kind": "none", "dimension": 384}}}
        assert client.post("/collections", json=own).status_code == 201
        offline = data / "collections" / "scifact-offline"
        exported = stored_vectors(offline)
        with_vectors = [{**doc, "vector": vector.tolist()} for doc, vector in zip(docs, exported)]
        assert {task["state"] for task in load(client, "scifact-vectors", with_vectors, per_request=500)} == {"succeeded"}
        assert_same_vector_rankings(client, "scifact-vectors", "scifact-offline", queries, OnnxEmbedder(offline / "model"))
        no_vector = client.post("/collections/scifact-vectors/search", json={"query": queries[0]})
        assert no_vector.status_code == 422 and no_vector.json()["detail"][0]["loc"] == ["body", "vector"]
        assert client.delete("/collections/scifact-vectors").status_code == 204

        # blue/green: the alias moves from v1 to the offline build and back while 8 clients search through it
        assert client.put("/aliases/scifact", json={"collection": "scifact-v1"}).status_code == 200
        stop, outcomes = threading.Event(), []
        searchers = [threading.Thread(target=search_under_load, args=(url, "scifact", queries, stop, outcomes)) for _ in range(8)]
        for thread in searchers:
            thread.start()
        for target in ("scifact-offline", "scifact-v1", "scifact-offline"):
            time.sleep(0.5)
            assert client.put("/aliases/scifact", json={"collection": target}).json()["aliases"] == {"scifact": target}
        time.sleep(0.5)
        assert client.delete("/collections/scifact-offline").status_code == 409  # the alias points to it
        assert client.delete("/collections/scifact-v1").status_code == 204  # dropped while the alias serves the other
        time.sleep(0.5)
        stop.set()
        for thread in searchers:
            thread.join()
        assert len(outcomes) > 8 and set(outcomes) == {200}, {str(o) for o in outcomes} - {"200"}
        assert [c["name"] for c in client.get("/collections").json()["collections"]] == ["scifact-offline"]
        assert not (data / "collections" / "scifact-v1").exists()

        # the default collection is a name the unprefixed routes follow, through an alias too
        assert client.put("/aliases/default", json={"collection": "scifact-offline"}).status_code == 200
        before = client.post("/search", json={"query": queries[0], "k": 10}).json()["hits"]
        info = client.get("/collections/scifact").json()
        assert info["name"] == "scifact-offline" and info["aliases"] == ["default", "scifact"]
        assert info["memory_bytes"] > count * 384 * 4 and info["disk_bytes"] > info["memory_bytes"]

    with running_server(None, env_for(data)) as (url, _), httpx.Client(base_url=url, timeout=120, headers=WRITER) as client:
        assert client.get("/aliases").json() == {"aliases": {"default": "scifact-offline", "scifact": "scifact-offline"}}
        assert client.get("/collections/scifact").json()["documents"] == count
        after = client.post("/search", json={"query": queries[0], "k": 10}).json()["hits"]
        assert [h["id"] for h in after] == [h["id"] for h in before]
        assert client.get(f"/tasks/{task['id']}").json()["state"] == "succeeded"  # tasks are kept in the data directory
        check_scoped_keys(client, queries[0])


def check_scoped_keys(client: httpx.Client, query: str) -> None:
    """A key limited to some collections and aliases works there and answers 403 naming the collection elsewhere."""
    app, viewer = {"X-API-Key": "app-key"}, {"X-API-Key": "viewer"}
    search = {"query": query, "k": 3}
    assert client.post("/collections/scifact/search", json=search, headers=app).status_code == 200  # its alias
    outside = client.post("/collections/scifact-offline/search", json=search, headers=app)  # the collection behind it
    assert outside.status_code == 403 and "scifact-offline" in outside.json()["detail"]
    assert client.post("/collections/nowhere/search", json=search, headers=app).status_code == 403  # no existence leak
    created = client.post("/collections", json={"name": "mine"}, headers=app)
    assert created.status_code == 403 and "'mine'" in created.json()["detail"]
    assert client.post("/admin/reload", headers=app).status_code == 403  # acts on every collection
    written = client.put("/collections/scifact/documents?wait=true", json={"documents": [{"id": "n1", "text": "new"}]}, headers=app)
    assert written.status_code == 200
    queued = client.put("/collections/scifact/documents?wait=false", json={"documents": [{"id": "n2", "text": "newer"}]}, headers=app)
    assert queued.status_code == 202  # its task is the collection's, which the alias lets the key see
    task_id = queued.json()["id"]
    wait_for(lambda: client.get(f"/tasks/{task_id}", headers=app).json().get("state") == "succeeded", 30, "the key's task")
    assert task_id in [t["id"] for t in client.get("/tasks", headers=app).json()["tasks"]]
    assert [c["name"] for c in client.get("/collections", headers=app).json()["collections"]] == ["scifact-offline"]
    assert client.get("/aliases", headers=app).json() == {"aliases": {"scifact": "scifact-offline"}}
    # a read key: searches in its scope (the default alias points there too), no writes
    assert client.post("/collections/scifact-offline/search", json=search, headers=viewer).status_code == 200
    assert client.post("/search", json=search, headers=viewer).status_code == 200
    refused = client.delete("/collections/scifact-offline/documents/n1", headers=viewer)
    assert refused.status_code == 403 and "read key" in refused.json()["detail"]


def test_collection_lifecycle(scifact, tmp_path):
    lifecycle(scifact, tmp_path, 80)


@pytest.mark.slow
def test_collection_lifecycle_on_2000_documents(scifact, tmp_path):
    lifecycle(scifact, tmp_path, 2000)
