"""SIGKILL a real server during an API bulk load: every document the task reported done is there after a restart,
the task reads `interrupted`, and the collection takes writes again."""

from __future__ import annotations

import time

import httpx
import pytest

from hybrid_retrieval.evaluation.server import running_server

KEY = {"X-API-Key": "crash-loader"}
DOCUMENTS = 3000


def env_for(data) -> dict[str, str]:
    return {"HYBRID_DATA": str(data), "HYBRID_WRITE_KEYS": "crash-loader", "HYBRID_MAX_BATCH_DOCS": "100", "HYBRID_VERIFY": "size"}


def document(i: int) -> dict:
    return {"id": f"doc-{i}", "title": f"note {i}", "text": f"entry {i} of the load, about topic {i % 37}", "metadata": {"n": i}}


@pytest.mark.crash
def test_acknowledged_documents_of_a_bulk_load_survive_sigkill(tmp_path):
    data = tmp_path / "data"
    acknowledged = []
    for round_no in range(2):
        with running_server(None, env_for(data)) as (url, process), httpx.Client(base_url=url, timeout=60, headers=KEY) as client:
            if round_no == 0:
                assert client.post("/collections", json={"name": "notes"}).status_code == 201
            docs = [document(i) for i in range(round_no * DOCUMENTS, (round_no + 1) * DOCUMENTS)]
            task = client.put("/collections/notes/documents?wait=false", json={"documents": docs}).json()
            done = 0
            while done < 300:  # a few batches in, well before the end
                state = client.get(f"/tasks/{task['id']}").json()
                assert state["state"] in ("queued", "running"), state  # the worker may not have picked it up yet
                done = state["documents_done"]
                time.sleep(0.05)
            process.kill()  # SIGKILL: no shutdown hooks, no flush
            process.wait()
            acknowledged.append((task["id"], [d["id"] for d in docs[:done]]))
    with running_server(None, env_for(data)) as (url, _), httpx.Client(base_url=url, timeout=60, headers=KEY) as client:
        for task_id, ids in acknowledged:
            report = client.get(f"/tasks/{task_id}").json()
            assert report["state"] == "interrupted" and report["documents_done"] >= len(ids)
            missing = [doc_id for doc_id in ids if client.get(f"/collections/notes/documents/{doc_id}").status_code != 200]
            assert not missing, f"{len(missing)} acknowledged documents lost, e.g. {missing[:3]}"
        stats = client.get("/collections/notes/stats").json()
        assert stats["documents"] >= sum(len(ids) for _, ids in acknowledged)
        after = {"id": "after", "text": "a quokka was written after the crash"}
        assert client.put("/collections/notes/documents?wait=true", json={"documents": [after]}).status_code == 200
        hits = client.post("/collections/notes/search", json={"query": "quokka", "mode": "bm25", "k": 1}).json()["hits"]
        assert [hit["id"] for hit in hits] == ["after"]
