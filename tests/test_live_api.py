"""The write API: key roles, all-or-nothing batches, read-your-writes, visibility, and restart durability."""

from __future__ import annotations

import json
import shutil

import pytest
from fastapi.testclient import TestClient

from hybrid_retrieval.app.main import create_app
from hybrid_retrieval.app.settings import Settings
from hybrid_retrieval.indexer.store import open_index
from tests.conftest import TINY_CORPUS

pytestmark = pytest.mark.server  # each test talks to the service (a process, or create_app in this one)

WRITE, READ = {"X-API-Key": "writer"}, {"X-API-Key": "reader"}


@pytest.fixture
def index_dir(tiny_index, tmp_path):
    shutil.copytree(tiny_index, tmp_path / "index")
    return tmp_path / "index"


def client_for(index_dir, **settings):
    settings = {"api_keys": "reader", "write_keys": "writer", "refresh_interval": 0.05, **settings}
    return TestClient(create_app(Settings(**settings), index=open_index(index_dir)))


def ids(client, query, headers=READ, **body):
    response = client.post("/search", json={"query": query, "k": 20, **body}, headers=headers)
    assert response.status_code == 200, response.text
    return [hit["id"] for hit in response.json()["hits"]]


def test_written_documents_are_searchable_readable_and_deletable(index_dir):
    with client_for(index_dir) as client:
        doc = {"id": "n1", "title": "Quokka", "text": "The quokka is a small marsupial.", "metadata": {"kind": "animal"}}
        written = client.put("/documents?wait=true", json={"documents": [doc]}, headers=WRITE)
        assert written.status_code == 200 and written.json() == {"sequence": 1, "documents": 1, "visible": True}
        assert ids(client, "quokka marsupial", mode="bm25") == ["n1"]
        assert client.get("/documents/n1", headers=READ).json() == {**doc, "metadata": {"kind": "animal"}}
        assert "n1" in ids(client, "quokka", filter={"kind": "animal"})
        client.put("/documents?wait=true", json={"documents": [{"id": "d1", "text": "Replaced: nothing about felines."}]}, headers=WRITE)
        assert "d1" not in ids(client, "cats", mode="bm25")
        assert client.delete("/documents/n1?wait=true", headers=WRITE).json()["sequence"] == 3
        assert ids(client, "quokka marsupial", mode="bm25") == [] and client.get("/documents/n1", headers=READ).status_code == 404
        assert client.post("/documents/delete?wait=true", json={"ids": ["d2", "d3"]}, headers=WRITE).json()["sequence"] == 4
        stats = client.get("/stats", headers=READ).json()
        assert stats == {
            "documents": len(TINY_CORPUS) - 2,
            "base_documents": len(TINY_CORPUS),
            "deleted_base_documents": 3,
            "live_documents": 1,
            "last_sequence": 4,
            "visible_sequence": 4,
            "writable": True,
            "write_refusal": None,
            "temporary_bytes": 0,
        }
        client.put("/documents?wait=true", json={"documents": [{"id": 42, "text": "an integer id"}]}, headers=WRITE)
        assert client.get("/documents/42", headers=READ).status_code == 200
        assert client.post("/documents/delete?wait=true", json={"ids": [42]}, headers=WRITE).status_code == 200  # as written
        assert client.get("/documents/42", headers=READ).status_code == 404
    with client_for(index_dir) as client:  # a restart replays the log
        assert client.get("/stats", headers=READ).json()["last_sequence"] == 6
        assert client.get("/documents/d1", headers=READ).json()["text"] == "Replaced: nothing about felines."
        assert "d2" not in ids(client, "dogs chase cats", mode="bm25")


def test_ndjson_batches_and_visibility_within_the_refresh_interval(index_dir):
    import time

    with client_for(index_dir, refresh_interval=0.2) as client:
        body = "\n".join(json.dumps({"id": f"n{i}", "text": f"wombat number {i}"}) for i in range(3)) + "\n"
        written = client.put("/documents", content=body, headers={**WRITE, "content-type": "application/x-ndjson"})
        assert written.status_code == 200 and written.json()["documents"] == 3
        assert client.get("/documents/n2", headers=READ).status_code == 200  # read-your-writes before the refresh
        deadline = time.monotonic() + 5
        while not ids(client, "wombat", mode="bm25") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sorted(ids(client, "wombat", mode="bm25")) == ["n0", "n1", "n2"]


@pytest.mark.parametrize(
    "documents, loc",
    [
        ([{"id": "ok", "text": "fine"}, {"id": "bad", "title": "only a title"}], ["documents", 1, "text"]),
        ([{"id": "ok", "text": "fine"}, {"id": "x" * 513, "text": "t"}], ["documents", 1, "id"]),
        ([{"id": "ok", "text": "fine"}, {"id": "ok", "text": "again"}], ["documents", 1, "id"]),
        ([{"id": "ok", "text": "fine", "metadata": {"lang": 3}}], ["documents", 0, "metadata", "lang"]),
        ([{"id": "ok", "text": "fine", "metadata": {"nested": {"a": 1}}}], ["documents", 0, "metadata", "nested"]),
        ([{"id": "ok", "text": "fine", "title": 0}], ["documents", 0, "title"]),
        ([{"id": "ok", "text": "fine", "title": False}], ["documents", 0, "title"]),
        ([{"id": "ok", "text": "fine", "metadata": False}], ["documents", 0, "metadata"]),
        ([{"id": "ok", "text": "fine", "metadata": []}], ["documents", 0, "metadata"]),
    ],
)
def test_a_bad_item_rejects_the_batch_naming_it(index_dir, documents, loc):
    with client_for(index_dir) as client:
        response = client.put("/documents?wait=true", json={"documents": documents}, headers=WRITE)
        assert response.status_code == 422, response.text
        assert response.json()["detail"][0]["loc"][-len(loc) :] == loc
        assert client.get("/documents/ok", headers=READ).status_code == 404
        assert client.get("/stats", headers=READ).json()["last_sequence"] == 0


def test_limits_and_encoding(index_dir):
    with client_for(index_dir, max_batch_docs=2) as client:
        too_many = client.put("/documents", json={"documents": [{"id": str(i), "text": "t"} for i in range(3)]}, headers=WRITE)
        assert too_many.status_code == 422 and "at most 2 documents" in too_many.text
        invalid = client.put(
            "/documents", content=b'{"documents": [{"id": "a", "text": "\xff"}]}', headers={**WRITE, "content-type": "application/json"}
        )
        assert invalid.status_code == 422 and "UTF-8" in invalid.text


def test_key_roles(index_dir):
    with client_for(index_dir) as client:
        doc = {"documents": [{"id": "n1", "text": "t"}]}
        assert client.put("/documents", json=doc).status_code == 401
        assert client.put("/documents", json=doc, headers=READ).status_code == 403
        assert client.post("/search", json={"query": "cats"}, headers=WRITE).status_code == 200  # write keys may search
        assert client.post("/admin/reload", headers=READ).status_code == 403
    with client_for(index_dir, api_keys=None, write_keys=None) as client:
        refused = client.put("/documents", json=doc)
        assert refused.status_code == 403 and "HYBRID_WRITE_KEYS" in refused.json()["detail"]
        assert client.post("/search", json={"query": "cats"}).status_code == 200  # searches stay open


def test_an_index_that_cannot_take_writes_is_served_read_only(index_dir):
    shutil.rmtree(index_dir / "postings")  # as built before live writes existed
    manifest = json.loads((index_dir / "manifest.json").read_text())
    manifest["files"] = {k: v for k, v in manifest["files"].items() if not k.startswith("postings/")}
    (index_dir / "manifest.json").write_text(json.dumps(manifest))
    with client_for(index_dir) as client:
        assert client.post("/search", json={"query": "cats"}, headers=READ).status_code == 200
        refused = client.put("/documents", json={"documents": [{"id": "n", "text": "t"}]}, headers=WRITE)
        assert refused.status_code == 409 and "rebuild it" in refused.json()["detail"]
        assert client.get("/stats", headers=READ).json()["writable"] is False


def test_ndjson_keeps_unicode_line_separators_inside_strings(index_dir):
    with client_for(index_dir) as client:
        line = json.dumps({"id": "u1", "text": "first\u2028second\u0085third"}, ensure_ascii=False)
        response = client.put("/documents", content=line.encode(), headers={**WRITE, "content-type": "application/x-ndjson"})
        assert response.status_code == 200, response.text
        assert client.get("/documents/u1", headers=READ).json()["text"] == "first\u2028second\u0085third"


def test_a_log_held_by_another_writer_answers_409(index_dir):
    from hybrid_retrieval.indexer.live.log import LIVE_DIR, WAL_FILE
    from hybrid_retrieval.indexer.wal import WriteAheadLog

    held = WriteAheadLog(index_dir / LIVE_DIR / WAL_FILE, lock=True)  # e.g. `hybrid ingest` running on the index
    try:
        with client_for(index_dir) as client:
            response = client.put("/documents", json={"documents": [{"id": "a", "text": "t"}]}, headers=WRITE)
            assert response.status_code == 409 and "held by another process" in response.json()["detail"]
    finally:
        held.close()
