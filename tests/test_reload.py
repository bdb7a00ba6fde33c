import contextlib
import shutil
import signal
import threading
import time

import httpx
import pytest
from fastapi.testclient import TestClient

from hybrid_retrieval.app.main import create_app
from hybrid_retrieval.app.settings import Settings
from hybrid_retrieval.evaluation.server import running_server
from hybrid_retrieval.indexer.build import BuildOptions, build_index
from tests.conftest import TINY_CORPUS, write_jsonl

pytestmark = pytest.mark.server  # each test talks to the service (a process, or create_app in this one)

KEY = "reload-test-key"


@pytest.fixture
def server(tiny_index, tmp_path):
    index_dir = tmp_path / "index"
    shutil.copytree(tiny_index, index_dir)
    with running_server(index_dir, {"HYBRID_WRITE_KEYS": KEY}) as (url, process):
        yield url, index_dir, process


def _hammer(url, stop, outcomes):
    with httpx.Client(base_url=url, timeout=30, headers={"X-API-Key": KEY}) as client:
        while not stop.is_set():
            try:
                response = client.post("/search", json={"query": "cat", "k": 3})
                outcomes.append(response.status_code == 200 and len(response.json()["hits"]) >= 1)
            except httpx.HTTPError:
                outcomes.append(False)


def test_reload_under_load_loses_no_request(server, tmp_path, capsys):
    url, index_dir, _ = server
    stop, outcomes = threading.Event(), []
    clients = [threading.Thread(target=_hammer, args=(url, stop, outcomes)) for _ in range(4)]
    for t in clients:
        t.start()
    try:
        headers = {"X-API-Key": KEY}
        for size in (3, 5):  # rebuild the folder in place with another corpus, then reload it
            build_index(write_jsonl(tmp_path / f"c{size}.jsonl", TINY_CORPUS[:size]), index_dir, BuildOptions(progress=False))
            response = httpx.post(f"{url}/admin/reload", headers=headers, timeout=60)
            assert response.status_code == 200 and response.json()["documents"] == size
        time.sleep(0.5)
    finally:
        stop.set()
        for t in clients:
            t.join(timeout=30)
    with capsys.disabled():
        print(f"\nreload under load: {len(outcomes)} requests by 4 clients across 2 rebuilds + reloads, {outcomes.count(False)} failed")
    assert len(outcomes) > 20 and all(outcomes), f"{outcomes.count(False)} failed of {len(outcomes)}"
    assert httpx.get(f"{url}/ready").json()["documents"] == 5


def test_reload_needs_the_key_and_survives_a_broken_index(server):
    url, index_dir, _ = server
    assert httpx.post(f"{url}/admin/reload").status_code == 401
    assert httpx.post(f"{url}/admin/reload", headers={"X-API-Key": "wrong"}).status_code == 403
    # a file replaced by a broken one (a served index's files are memory-mapped: they are never changed in place)
    (index_dir / "dense.faiss.new").write_bytes(b"corrupted")
    (index_dir / "dense.faiss.new").replace(index_dir / "dense.faiss")
    response = httpx.post(f"{url}/admin/reload", headers={"X-API-Key": KEY}, timeout=60)
    assert response.status_code == 409 and "still serving the previous index" in response.json()["detail"]
    assert httpx.post(f"{url}/search", json={"query": "cat"}, headers={"X-API-Key": KEY}).status_code == 200
    written = httpx.put(f"{url}/documents?wait=true", json={"documents": [{"id": "w1", "text": "zebra"}]}, headers={"X-API-Key": KEY})
    assert written.status_code == 200 and written.json()["visible"]  # the previous index takes writes again
    assert httpx.get(f"{url}/documents/w1", headers={"X-API-Key": KEY}).json()["text"] == "zebra"


@contextlib.contextmanager
def reload_held_open(client: TestClient, headers: dict):
    """POST /admin/reload in a thread, held while it opens the folder again (the body runs then), finished after."""
    (reloader,) = client.app.state.collections.served.values()
    opening, go_on, opener = threading.Event(), threading.Event(), reloader.opener

    def slow_opener():
        opening.set()
        go_on.wait(30)
        return opener()

    reloader.opener = slow_opener
    reloading = threading.Thread(target=lambda: client.post("/admin/reload", headers=headers))
    reloading.start()
    assert opening.wait(30)
    try:
        yield
    finally:
        go_on.set()
        reloading.join(30)


def test_a_write_during_a_reload_is_refused_and_none_acknowledged_is_hidden(tiny_index, tmp_path):
    """While a reload opens the folder again, writes answer 409 (write again); none is acknowledged by the collection
    being replaced, where the new one would not hold it."""
    index_dir = tmp_path / "index"
    shutil.copytree(tiny_index, index_dir)
    headers = {"X-API-Key": KEY}
    with TestClient(create_app(Settings(index=index_dir, write_keys=KEY))) as client:
        assert client.put("/documents?wait=true", json={"documents": [{"id": "a", "text": "aardvark"}]}, headers=headers).status_code == 200
        with reload_held_open(client, headers):
            during = client.put("/documents", json={"documents": [{"id": "b", "text": "badger"}]}, headers=headers)
        assert during.status_code == 409 and "reloading" in during.json()["detail"]
        after = client.put("/documents?wait=true", json={"documents": [{"id": "b", "text": "badger"}]}, headers=headers)
        assert after.status_code == 200 and after.json()["sequence"] == 2
        assert client.get("/documents/a", headers=headers).status_code == 200
        assert client.get("/documents/b", headers=headers).json()["text"] == "badger"
        assert client.get("/stats", headers=headers).json()["last_sequence"] == 2


def test_writes_after_a_rebuild_in_place_are_refused_until_the_reload(server, tmp_path):
    """The rebuild publishes another folder under the running service: a write then would go into the gone folder's
    log (lost at the reload) and must not be acknowledged. After the reload, writes go to the new folder."""
    url, index_dir, _ = server
    headers = {"X-API-Key": KEY}
    first = httpx.put(f"{url}/documents", json={"documents": [{"id": "w1", "text": "zebra"}]}, headers=headers)
    assert first.status_code == 200  # the service holds the folder's log now
    build_index(write_jsonl(tmp_path / "three.jsonl", TINY_CORPUS[:3]), index_dir, BuildOptions(progress=False))
    refused = httpx.put(f"{url}/documents", json={"documents": [{"id": "w2", "text": "yak"}]}, headers=headers)
    assert refused.status_code == 409 and "was replaced by another process" in refused.json()["detail"]
    assert httpx.post(f"{url}/admin/reload", headers=headers, timeout=60).status_code == 200
    again = httpx.put(f"{url}/documents?wait=true", json={"documents": [{"id": "w2", "text": "yak"}]}, headers=headers)
    assert again.status_code == 200 and again.json()["sequence"] == 1
    assert httpx.get(f"{url}/ready").json()["documents"] == 4


def test_sighup_reloads(server, tmp_path):
    url, index_dir, process = server
    build_index(write_jsonl(tmp_path / "two.jsonl", TINY_CORPUS[:2]), index_dir, BuildOptions(progress=False))
    process.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and httpx.get(f"{url}/ready").json()["documents"] != 2:
        time.sleep(0.2)
    assert httpx.get(f"{url}/ready").json()["documents"] == 2


def test_a_bulk_load_runs_on_across_a_reload(tiny_index, tmp_path):
    """A bulk load's batch that meets the collection closed by a reload waits for the reopened one: the task
    succeeds, and every document is in the collection once."""
    index_dir = tmp_path / "index"
    shutil.copytree(tiny_index, index_dir)
    headers = {"X-API-Key": KEY}
    documents = [{"id": f"n{i}", "text": f"numbat {i}"} for i in range(6)]
    with TestClient(create_app(Settings(index=index_dir, write_keys=KEY, max_batch_docs=2))) as client:
        with reload_held_open(client, headers):
            task = client.put("/documents?wait=false", json={"documents": documents}, headers=headers).json()
            time.sleep(0.3)  # its first batch meets the closed collection
            assert client.get(f"/tasks/{task['id']}", headers=headers).json()["documents_done"] == 0
        deadline = time.monotonic() + 30
        while (state := client.get(f"/tasks/{task['id']}", headers=headers).json())["state"] not in ("succeeded", "failed"):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert state["state"] == "succeeded" and state["documents_done"] == 6, state
        assert [client.get(f"/documents/n{i}", headers=headers).status_code for i in range(6)] == [200] * 6
        assert client.get("/stats", headers=headers).json()["last_sequence"] == 3
