"""SIGKILL a real server at several points while it takes a snapshot and while it restores one: the data directory
reopens, the source collection is intact, no partial snapshot is listed, no half-restored collection is served, and
what a killed step left behind is removed at the next start."""

from __future__ import annotations

import httpx
import pytest

from hybrid_retrieval.evaluation.server import running_server

KEY = {"X-API-Key": "crash-writer"}
SNAPSHOTS = "hybrid_retrieval.indexer.datadir.snapshots"


def env_for(data, kill_at: str | None = None) -> dict[str, str]:
    env = {"HYBRID_DATA": str(data), "HYBRID_WRITE_KEYS": "crash-writer", "HYBRID_VERIFY": "size", "HYBRID_REFRESH_INTERVAL": "0.1"}
    return {**env, "KILL_AT": kill_at, "KILL_RUN": "hybrid_retrieval.app"} if kill_at else env


def notes(start: int, count: int) -> list[dict]:
    return [
        {"id": f"n{i}", "text": f"note {i} about topic {i % 7} and the lantern", "vector": [1.0, i % 5, i % 3, 0.5]}
        for i in range(start, start + count)
    ]


def create_notes(client: httpx.Client, count: int) -> None:
    """Collection `notes` (documents bring their vectors), holding `count` notes."""
    settings = {"embedder": {"kind": "none", "dimension": 4}}
    assert client.post("/collections", json={"name": "notes", "settings": settings}).status_code == 201
    assert client.put("/collections/notes/documents?wait=true", json={"documents": notes(0, count)}).status_code == 200


def state(client: httpx.Client, name: str) -> tuple[int, list]:
    """What a collection answers: its document count and a search's hits."""
    stats = client.get(f"/collections/{name}/stats").json()
    hits = client.post(f"/collections/{name}/search", json={"query": "lantern topic 3", "vector": [1, 2, 0, 0.5], "k": 50}).json()["hits"]
    return stats["documents"], [(hit["id"], round(hit["score"], 6)) for hit in hits]


def killed(data, kill_at: str, request) -> None:
    """Start a server with `kill_at` planted, send `request(client)`, and see the process die of SIGKILL."""
    with running_server(None, env_for(data, kill_at), module="tests.kill_at") as (url, process):
        with httpx.Client(base_url=url, headers=KEY, timeout=60) as client, pytest.raises(httpx.TransportError):
            request(client)
        assert process.wait(timeout=30) == -9
    assert leftovers(data), "killed before the step started its work"


def leftovers(data) -> list[str]:
    """What killed work left: hidden staging, building and partial files."""
    return [p.name for folder in ("collections", "snapshots") for p in (data / folder).iterdir() if p.name.startswith(".")]


@pytest.mark.crash
@pytest.mark.parametrize(
    "kill_at",
    [
        f"{SNAPSHOTS}:stage",  # inside the frozen point, holding the collection's locks
        f"{SNAPSHOTS}:write_archive",  # staged, no archive yet
        f"{SNAPSHOTS}:_HashingReader.read@6",  # half the archive written
        "os:rename",  # the archive complete and fsync'ed, not yet renamed into the listing
    ],
)
def test_a_snapshot_killed_at_any_step_leaves_the_collection_whole_and_lists_nothing(tmp_path, kill_at):
    data = tmp_path / "data"
    with running_server(None, env_for(data)) as (url, _), httpx.Client(base_url=url, headers=KEY, timeout=60) as client:
        create_notes(client, 40)
        before = state(client, "notes")
    killed(data, kill_at, lambda client: client.post("/collections/notes/snapshots"))
    with running_server(None, env_for(data)) as (url, _), httpx.Client(base_url=url, headers=KEY, timeout=60) as client:
        assert state(client, "notes") == before
        assert client.get("/collections/notes/snapshots").json()["snapshots"] == []
        assert leftovers(data) == []
        assert client.post("/collections/notes/snapshots").status_code == 201  # and the next one works


@pytest.mark.crash
@pytest.mark.parametrize(
    ("kill_at", "into", "replaced"),
    [
        (f"{SNAPSHOTS}:_relative@3", "copy", False),  # mid-extraction into a new collection
        (f"{SNAPSHOTS}:check_opens", "notes", False),  # extracted, checked, opening in staging, not yet swapped in
        ("hybrid_retrieval.engine.serving:Reloader.open@2", "notes", True),  # swapped in, not yet serving (@1: at start)
        ("shutil:rmtree", "notes", True),  # swapped in over `notes`, the old folder not yet removed
    ],
)
def test_a_restore_killed_at_any_step_serves_the_old_or_the_whole_restored_collection(tmp_path, kill_at, into, replaced):
    data = tmp_path / "data"
    with running_server(None, env_for(data)) as (url, _), httpx.Client(base_url=url, headers=KEY, timeout=60) as client:
        create_notes(client, 30)
        snapshot = client.post("/collections/notes/snapshots").json()
        at_snapshot = state(client, "notes")
        assert client.put("/collections/notes/documents?wait=true", json={"documents": notes(30, 20)}).status_code == 200
        latest = state(client, "notes")
    assert at_snapshot != latest

    def restore(client: httpx.Client) -> None:
        client.post(f"/collections/{into}/snapshots/restore?replace=true", json={"snapshot": snapshot["id"]})

    killed(data, kill_at, restore)
    with running_server(None, env_for(data)) as (url, _), httpx.Client(base_url=url, headers=KEY, timeout=60) as client:
        assert state(client, "notes") == (at_snapshot if replaced else latest)
        if into != "notes":
            assert client.get(f"/collections/{into}/stats").status_code == 404
        assert [s["id"] for s in client.get("/collections/notes/snapshots").json()["snapshots"]] == [snapshot["id"]]
        assert leftovers(data) == []
        # the restore, tried again, completes
        again = client.post(f"/collections/{into}/snapshots/restore?replace=true", json={"snapshot": snapshot["id"]})
        assert again.status_code == 201, again.text
        assert state(client, into) == at_snapshot
