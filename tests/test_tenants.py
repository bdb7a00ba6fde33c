"""One tenant never reaches, breaks or fills another (issue 52), against real server processes: crafted snapshots are
refused in staging and change nothing, one damaged collection never stops the service, per-collection reads and
metrics follow the key's scope, the client sends every id as that id, and status codes and types are as documented."""

from __future__ import annotations

import concurrent.futures
import hashlib
import io
import json
import logging
import random
import tarfile
import threading
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hybrid_retrieval.client import Client
from hybrid_retrieval.client.errors import NotFound as ClientNotFound
from hybrid_retrieval.client.errors import ValidationError as ClientValidationError
from hybrid_retrieval.evaluation.server import running_server
from hybrid_retrieval.indexer.datadir.snapshots import TRAILER
from hybrid_retrieval.indexer.live.log import log_path
from tests.test_snapshots import hybrid

ADMIN = {"X-API-Key": "admin-key"}
TENANT = {"X-API-Key": "tenant-key"}  # writes tenant-a alone
READER = {"X-API-Key": "reader-key"}  # reads tenant-a alone
SCRAPER = {"Authorization": "Bearer scrape-key"}
DIMENSION = 4
WAL_MEMBER = "collection/live/wal.log"


def keyed_env(tmp_path: Path, data: Path | None = None, **more: str) -> dict[str, str]:
    keys = tmp_path / "keys"
    keys.write_text("admin-key write *\ntenant-key write tenant-a\nreader-key read tenant-a\n")
    return {
        "HYBRID_DATA": str(data or tmp_path / "data"),
        "HYBRID_WRITE_KEYS_FILE": str(keys),
        "HYBRID_METRICS_KEY": "scrape-key",
        "HYBRID_REFRESH_INTERVAL": "0.1",
        "HYBRID_VERIFY": "size",
        "HYBRID_COMPACT_MIN_DOCS": "100000",  # no compaction changes a folder under a test's comparison
        **more,
    }


def own_vectors(name: str) -> dict:
    return {"name": name, "settings": {"embedder": {"kind": "none", "dimension": DIMENSION}}}


def notes(first: int, count: int) -> list[dict]:
    rng = random.Random(first)
    return [
        {"id": f"n{i}", "text": f"note {i} about {rng.choice(['quokkas', 'lanterns', 'maple', 'quartz'])}", "vector": vector(rng)}
        for i in range(first, first + count)
    ]


def vector(rng: random.Random) -> list[float]:
    return [rng.uniform(-1, 1) for _ in range(DIMENSION)]


def fill(client: httpx.Client, name: str, batches: int = 3) -> None:
    """`batches` writes (so the log holds that many records), visible."""
    for batch in range(batches):
        reply = client.put(f"/collections/{name}/documents?wait=true", json={"documents": notes(10 * batch, 10)})
        assert reply.status_code == 200, reply.text


def ranking(client: httpx.Client, name: str) -> list:
    body = {"query": "note quokkas", "vector": [0.3, -0.2, 0.5, 0.1], "k": 50, "depth": 50}
    reply = client.post(f"/collections/{name}/search", json=body)
    assert reply.status_code == 200, reply.text
    return [(hit["id"], round(hit["score"], 5)) for hit in reply.json()["hits"]]


def listing(folder: Path) -> dict[str, tuple[int, str]]:
    """Every file under `folder` with its size and sha256."""
    return {
        str(path.relative_to(folder)): (path.stat().st_size, hashlib.sha256(path.read_bytes()).hexdigest())
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def written_bytes(pid: int | str = "self") -> int:
    """What process `pid` has written so far: /proc/PID/io's wchar."""
    return int(next(line for line in Path(f"/proc/{pid}/io").read_text().splitlines() if line.startswith("wchar")).split()[1])


# --- crafting snapshots -------------------------------------------------------------------------------------------


def unpack(archive: bytes) -> tuple[dict[str, bytes], dict]:
    """The members before the trailer (name -> bytes, in order) and the trailer (its check left out)."""
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:") as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
    trailer = json.loads(members.pop(TRAILER))
    trailer.pop("check")
    return members, trailer


def _canonical(data: dict) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()


def forge(members: dict[str, bytes], trailer: dict, extra: list[tuple[tarfile.TarInfo, bytes]] = (), key: bytes | None = None) -> bytes:
    """A snapshot of `members` (and the raw `extra` members) whose trailer is consistent with them: every checksum
    recomputed, as anyone can, and signed with `key` when given."""
    import hmac

    buffer = io.BytesIO()
    tar = tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT)
    files = {}
    for name, content in members.items():
        member = tarfile.TarInfo(name)
        member.size = len(content)
        tar.addfile(member, io.BytesIO(content))
        files[name.split("/", 1)[-1]] = {"bytes": len(content), "sha256": hashlib.sha256(content).hexdigest()}
    for member, content in extra:
        tar.addfile(member, io.BytesIO(content) if content else None)
        if "GNU.sparse.size" in member.pax_headers:  # listed as the size it declares, as an attacker would
            files[member.name.split("/", 1)[-1]] = {"bytes": int(member.pax_headers["GNU.sparse.size"]), "sha256": "0" * 64}
    described = {**trailer, "files": files, "archive_sha256": hashlib.sha256(buffer.getvalue()).hexdigest()}
    described.pop("signature", None)
    if key is not None:
        described["signature"] = hmac.new(key, _canonical(described), hashlib.sha256).hexdigest()
    body = _canonical({**described, "check": hashlib.sha256(_canonical(described)).hexdigest()})
    member = tarfile.TarInfo(TRAILER)
    member.size = len(body)
    tar.addfile(member, io.BytesIO(body))
    tar.close()
    return buffer.getvalue()


def damage_first_record(log: bytes) -> bytes:
    """A log whose first record's payload has one byte changed, intact records after it (CorruptLog)."""
    damaged = bytearray(log)
    damaged[20] ^= 0x20
    return bytes(damaged)


def sparse_member(name: str, declared: int) -> tuple[tarfile.TarInfo, bytes]:
    """A GNU sparse member (PAX 0.1) of 4 real bytes that declares `declared` bytes: extracted, it writes them all."""
    member = tarfile.TarInfo(name)
    member.size = 4
    member.pax_headers = {"GNU.sparse.map": f"{declared - 4},4", "GNU.sparse.size": str(declared), "GNU.sparse.name": name}
    return member, b"boom"


def upload(client: httpx.Client, name: str, archive: bytes, replace: bool = False) -> httpx.Response:
    return client.post(
        f"/collections/{name}/snapshots/restore{'?replace=true' if replace else ''}",
        content=archive,
        headers={"Content-Type": "application/x-tar"},
    )


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """One server for the tests that leave it as they found it: tenant-a (the tenant's) and tenant-b (another's),
    filled, and a snapshot of tenant-a downloaded."""
    tmp_path = tmp_path_factory.mktemp("tenants")
    with running_server(None, keyed_env(tmp_path)) as (url, server), httpx.Client(base_url=url, headers=ADMIN, timeout=120) as admin:
        for name in ("tenant-a", "tenant-b"):
            assert admin.post("/collections", json=own_vectors(name)).status_code == 201
            fill(admin, name)
        taken = admin.post("/collections/tenant-a/snapshots").json()
        archive = admin.get(f"/collections/tenant-a/snapshots/{taken['id']}").content
        yield url, tmp_path / "data", archive, server


# --- 1, 2, 9: crafted snapshots -------------------------------------------------------------------------------------


@pytest.mark.server
def test_a_forged_snapshot_with_a_damaged_log_changes_nothing_and_the_service_restarts(tmp_path):
    env = keyed_env(tmp_path)
    with running_server(None, env) as (url, _), httpx.Client(base_url=url, headers=TENANT, timeout=120) as tenant:
        httpx.post(f"{url}/collections", json=own_vectors("tenant-b"), headers=ADMIN).raise_for_status()
        assert tenant.post("/collections", json=own_vectors("tenant-a")).status_code == 201
        fill(tenant, "tenant-a")
        taken = tenant.post("/collections/tenant-a/snapshots").json()
        members, trailer = unpack(tenant.get(f"/collections/tenant-a/snapshots/{taken['id']}").content)
        members[WAL_MEMBER] = damage_first_record(members[WAL_MEMBER])
        poisoned = forge(members, trailer)
        before = listing(tmp_path / "data" / "collections")
        expected = ranking(tenant, "tenant-a")

        # as a new collection: refused, nothing in the data directory (the scoped key may create tenant-a only)
        admin = httpx.Client(base_url=url, headers=ADMIN, timeout=120)
        refused = upload(admin, "poisoned", poisoned)
        assert refused.status_code == 422 and "does not open" in refused.json()["detail"][0]["msg"], refused.text
        # over the tenant's own collection: refused, the old folder untouched, still serving and writable
        refused = upload(tenant, "tenant-a", poisoned, replace=True)
        assert refused.status_code == 422, refused.text
        assert listing(tmp_path / "data" / "collections") == before
        assert ranking(tenant, "tenant-a") == expected
        assert tenant.put("/collections/tenant-a/documents?wait=true", json={"documents": notes(100, 1)}).status_code == 200
        admin.close()
        offline = tmp_path / "poisoned.snapshot"
        offline.write_bytes(poisoned)
    # the next start serves both collections, the write acknowledged after the refusal included
    with running_server(None, env) as (url, _), httpx.Client(base_url=url, headers=ADMIN, timeout=120) as admin:
        listed = {c["name"]: c for c in admin.get("/collections").json()["collections"]}
        assert set(listed) == {"tenant-a", "tenant-b"} and listed["tenant-a"]["documents"] == 31
    # offline, restore and verify refuse it the same way
    verified = hybrid("snapshot", "verify", str(offline))
    assert verified.returncode == 2 and "does not open" in verified.stderr
    restored = hybrid("snapshot", "restore", str(offline), "--as", "poisoned", "--data", str(tmp_path / "data"))
    assert restored.returncode == 2 and not (tmp_path / "data" / "collections" / "poisoned").exists()


@pytest.mark.server
def test_a_sparse_member_is_refused_before_anything_is_written(shared, tmp_path):
    url, data, archive, server = shared
    members, trailer = unpack(archive)
    member, content = sparse_member("collection/embeddings-bomb.npy", 400_000_000)
    bomb = forge(members, trailer, extra=[(member, content)])
    before = listing(data / "collections")
    started = written_bytes(server.pid)
    with httpx.Client(base_url=url, headers=TENANT, timeout=120) as tenant:
        refused = upload(tenant, "tenant-a", bomb, replace=True)
    assert written_bytes(server.pid) - started < 10 * len(bomb)  # the upload itself, and little more
    assert listing(data / "collections") == before
    assert refused.status_code == 422, refused.text  # its declared size, more than the archive holds
    offline = tmp_path / "bomb.snapshot"
    offline.write_bytes(bomb)
    verified = hybrid("snapshot", "verify", str(offline), "--scratch", str(tmp_path))
    assert verified.returncode == 2 and "more than the archive holds" in verified.stderr
    assert sum(path.stat().st_size for path in tmp_path.rglob("*") if path.is_file()) < 10 * len(bomb)


@pytest.mark.parametrize("kind", [tarfile.SYMTYPE, tarfile.LNKTYPE])
@pytest.mark.server
def test_link_members_are_refused_by_restore_and_verify(shared, tmp_path, kind):
    url, _, archive, _ = shared
    members, trailer = unpack(archive)
    link = tarfile.TarInfo("collection/docs-link.jsonl")
    link.type, link.linkname = kind, "/etc/passwd"
    crafted = forge(members, trailer, extra=[(link, b"")])
    with httpx.Client(base_url=url, headers=ADMIN, timeout=120) as admin:
        assert upload(admin, "linked", crafted).status_code == 422
        assert "linked" not in {c["name"] for c in admin.get("/collections").json()["collections"]}
    (tmp_path / "linked.snapshot").write_bytes(crafted)
    assert hybrid("snapshot", "verify", str(tmp_path / "linked.snapshot")).returncode == 2


@pytest.mark.server
def test_a_referenced_model_file_outside_the_model_folder_is_refused(shared, tmp_path):
    url, data, archive, _ = shared
    members, trailer = unpack(archive)
    secret = tmp_path / "secret.txt"
    secret.write_text("not the tenant's")
    escape = f"model/../../../../../../../../..{secret}"
    trailer["referenced"] = {escape: {"bytes": secret.stat().st_size, "sha256": hashlib.sha256(secret.read_bytes()).hexdigest()}}
    before = listing(data / "collections")
    with httpx.Client(base_url=url, headers=ADMIN, timeout=120) as admin:
        refused = upload(admin, "escaped", forge(members, trailer))
    assert refused.status_code == 422 and "no model's" in refused.json()["detail"][0]["msg"], refused.text
    assert listing(data / "collections") == before


@pytest.mark.server
def test_a_signed_server_restores_only_its_own_snapshots(tmp_path):
    env = keyed_env(tmp_path, HYBRID_SNAPSHOT_KEY="server-secret")
    with running_server(None, env) as (url, _), httpx.Client(base_url=url, headers=ADMIN, timeout=120) as admin:
        assert admin.post("/collections", json=own_vectors("signed")).status_code == 201
        fill(admin, "signed", batches=1)
        taken = admin.post("/collections/signed/snapshots").json()
        archive = admin.get(f"/collections/signed/snapshots/{taken['id']}").content
        assert upload(admin, "copy", archive).status_code == 201
        members, trailer = unpack(archive)
        assert "signature" in trailer
        refused = upload(admin, "forged", forge(members, trailer))  # re-forged without the key: its signature is gone
        assert refused.status_code == 422 and "HYBRID_SNAPSHOT_KEY" in refused.json()["detail"][0]["msg"]
        other = upload(admin, "foreign", forge(members, trailer, key=b"another-secret"))
        assert other.status_code == 422


# --- a damaged collection on disk -------------------------------------------------------------------------------------


@pytest.mark.server
def test_one_damaged_collection_never_stops_the_service(tmp_path):
    env = keyed_env(tmp_path)
    with running_server(None, env) as (url, _), httpx.Client(base_url=url, headers=ADMIN, timeout=120) as admin:
        for name in ("tenant-a", "tenant-b"):
            assert admin.post("/collections", json=own_vectors(name)).status_code == 201
            fill(admin, name)
        expected = ranking(admin, "tenant-b")
    log = log_path(tmp_path / "data" / "collections" / "tenant-a")
    log.write_bytes(damage_first_record(log.read_bytes()))
    # a killed settings change's temporary file, swept at start
    leftover = tmp_path / "data" / "collections" / "tenant-b" / ".manifest.json.k1ll3d.tmp"
    leftover.write_text("{")
    with running_server(None, env) as (url, _), httpx.Client(base_url=url, headers=ADMIN, timeout=120) as admin:
        assert not leftover.exists()
        assert ranking(admin, "tenant-b") == expected
        ready = admin.get("/ready").json()
        assert ready["failed_collections"] == 1 and "hybrid repair" in ready["failed"]["tenant-a"]
        assert httpx.get(f"{url}/ready").json()["failed"] == {}  # named only to keys that may use it
        listed = {c["name"]: c for c in admin.get("/collections").json()["collections"]}
        assert listed["tenant-a"]["state"] == "failed" and "damaged" in listed["tenant-a"]["error"]
        assert listed["tenant-b"]["state"] == "ready"
        unavailable = admin.post("/collections/tenant-a/search", json={"query": "note"})
        assert unavailable.status_code == 503 and "hybrid repair" in unavailable.json()["detail"]
        assert "hybrid_collections_failed 1.0" in admin.get("/metrics").text
        # the key of another collection learns nothing of it
        assert httpx.post(f"{url}/collections/tenant-b/search", json={"query": "x"}, headers=TENANT).status_code == 403
        # dropped, its name is free again
        assert admin.delete("/collections/tenant-a").status_code == 204
        assert admin.post("/collections", json=own_vectors("tenant-a")).status_code == 201
        assert admin.get("/ready").json()["failed_collections"] == 0


# --- 4, 5: per-collection reads and metrics -------------------------------------------------------------------------


@pytest.mark.server
def test_stats_need_a_key_for_that_collection(shared):
    url, *_ = shared
    assert httpx.get(f"{url}/collections/tenant-a/stats").status_code == 401
    assert httpx.get(f"{url}/collections/tenant-a/stats", headers=READER).status_code == 200
    for name in ("tenant-b", "no-such-collection"):  # the same answer whether it exists or not
        refused = httpx.get(f"{url}/collections/{name}/stats", headers=READER)
        assert refused.status_code == 403, (name, refused.text)


@pytest.mark.server
def test_metrics_show_a_collection_only_to_keys_that_may_use_it(shared):
    url, *_ = shared

    def collections_named(headers: dict) -> set[str]:
        text = httpx.get(f"{url}/metrics", headers=headers).text
        assert "hybrid_requests_total" in text  # the service-wide series, to everyone
        return {line.split('collection="')[1].split('"')[0] for line in text.splitlines() if 'collection="' in line}

    assert collections_named({}) == set()
    assert collections_named(READER) == {"tenant-a"}
    assert collections_named(SCRAPER) == collections_named(ADMIN) >= {"tenant-a", "tenant-b"}
    # the scraper's key reads metrics and nothing else
    assert httpx.post(f"{url}/collections/tenant-a/search", json={"query": "note"}, headers=SCRAPER).status_code == 403


# --- 6: the client sends every id as that id ----------------------------------------------------------------------


AWKWARD = ["a/b", "%2F", "../tenant-b", "..a", "a/..", "a?b=c", "a#b", "ünïcødé 文字", "%", "a\\b", "./"]  # "." and "..": below


@pytest.mark.server
def test_every_awkward_id_reaches_the_server_as_itself(shared):
    url, *_ = shared
    with Client(url, api_key="admin-key") as client, httpx.Client(base_url=url, headers=ADMIN) as admin:
        assert admin.post("/collections", json=own_vectors("awkward")).status_code == 201
        rng = random.Random(5)
        documents = [{"id": doc_id, "text": f"awkward {i}", "vector": vector(rng)} for i, doc_id in enumerate(AWKWARD)]
        client.upsert("awkward", documents, wait=True)
        for doc_id in AWKWARD:
            assert client.get_document("awkward", doc_id).id == doc_id
        # "." and ".." can be no document's id (the server refuses to store them): deleting them deletes nothing, and
        # never the collection (DELETE .../documents/.. resolved by the HTTP client was DELETE /collections/awkward)
        for dot in (".", ".."):
            client.delete_document("awkward", dot, wait=True)
            with pytest.raises((ClientNotFound, ClientValidationError)):
                client.get_document("awkward", dot)
        assert client.stats("awkward").documents == len(AWKWARD)
        for doc_id in AWKWARD:
            client.delete_document("awkward", doc_id, wait=True)
            with pytest.raises(ClientNotFound):
                client.get_document("awkward", doc_id)
            assert client.stats("awkward").documents == len(AWKWARD) - AWKWARD.index(doc_id) - 1  # that one alone went
        assert {c.name for c in client.list_collections()} >= {"awkward", "tenant-a", "tenant-b"}
        for awkward in ("..", ".", "a/b", "../tenant-a"):
            for call in (
                lambda: client.search(awkward, query="note"),
                lambda: client.stats(awkward),
                lambda: client.delete_snapshot("awkward", awkward),
                lambda: client.task(awkward),
                lambda: client.get_collection(awkward),
            ):
                with pytest.raises(ClientNotFound):
                    call()
        with pytest.raises(ClientValidationError):
            client.get_document("awkward", "")
        assert admin.get("/collections/awkward/stats").status_code == 200  # still there
        assert admin.delete("/collections/awkward").status_code == 204


AWKWARD_NAMES = ["..", ".", "a/b", "../tenant-a", "a?b=c", "a#b", "%2F", "ünï"]


@pytest.mark.parametrize("awkward", AWKWARD_NAMES)
@pytest.mark.server
def test_every_client_method_sends_an_awkward_name_as_itself(shared, awkward, tmp_path):
    """Every method that puts a collection, alias, task or snapshot name in a path: the server answers about exactly
    that name (its 404 or 422 quotes it), and nothing else changed."""
    url, *_ = shared
    with Client(url, api_key="admin-key") as client:
        before = {c.name: c.documents for c in client.list_collections()}
        calls = {
            "get_collection": lambda: client.get_collection(awkward),
            "drop_collection": lambda: client.drop_collection(awkward),
            "update_settings": lambda: client.update_settings(awkward, defaults={"mode": "bm25"}),
            "set_alias": lambda: client.set_alias(awkward, "tenant-a"),
            "drop_alias": lambda: client.drop_alias(awkward),
            "search": lambda: client.search(awkward, query="note"),
            "search_batch": lambda: client.search_batch(awkward, [{"query": "note"}]),
            "upsert": lambda: client.upsert(awkward, notes(0, 1)),
            "get_document": lambda: client.get_document(awkward, "n1"),
            "delete": lambda: client.delete(awkward, ["n1"]),
            "delete_document": lambda: client.delete_document(awkward, "n1"),
            "stats": lambda: client.stats(awkward),
            "compact": lambda: client.compact(awkward),
            "task": lambda: client.task(awkward),
            "create_snapshot": lambda: client.create_snapshot(awkward),
            "delete_snapshot": lambda: client.delete_snapshot("tenant-a", awkward),
            "download_snapshot": lambda: client.download_snapshot("tenant-a", awkward, tmp_path / "x"),
            "restore_snapshot": lambda: client.restore_snapshot("tenant-a", snapshot_id=awkward, replace=True),
        }
        for method, call in calls.items():
            with pytest.raises((ClientNotFound, ClientValidationError)) as raised:
                call()
            error, detail = raised.value, str(raised.value)
            # the server quotes the name it saw, or refuses it as that path parameter (its pattern: 422 naming it);
            # a "/" splits a name into a path no route has (404 Not Found)
            as_parameter = isinstance(error, ClientValidationError) and error.field[:1] == ["path"]
            assert repr(awkward) in detail or as_parameter or ("/" in awkward and "Not Found" in detail), (method, detail)
        if "/" not in awkward:  # the snapshots of that name (a dropped collection's are listed too): none
            assert client.snapshots(awkward) == []
        assert {c.name: c.documents for c in client.list_collections()} == before


# --- 7, 8, 10: status codes and strict types -------------------------------------------------------------------------


@pytest.mark.server
def test_creates_racing_drops_never_answer_500(shared):
    url, *_ = shared
    statuses: list[int] = []
    lock = threading.Lock()

    def churn(worker: int) -> None:
        with httpx.Client(base_url=url, headers=ADMIN, timeout=120) as client:
            for _ in range(5):
                created = client.post("/collections", json=own_vectors("churn"))
                dropped = client.delete("/collections/churn")
                with lock:
                    statuses.extend([created.status_code, dropped.status_code])

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(churn, range(8)))
    assert len(statuses) == 80 and set(statuses) <= {201, 204, 404, 409}, sorted(set(statuses))
    httpx.delete(f"{url}/collections/churn", headers=ADMIN)


@pytest.mark.server
def test_a_write_past_its_deadline_is_504_naming_the_write_timeout(tmp_path, scifact_slice):
    env = keyed_env(tmp_path, HYBRID_WRITE_TIMEOUT="0.001")
    with running_server(None, env) as (url, _), httpx.Client(base_url=url, headers=ADMIN, timeout=120) as admin:
        assert admin.post("/collections", json={"name": "slow"}).status_code == 201  # the model embeds its documents
        with scifact_slice.open() as fh:
            documents = [{"id": doc["_id"], "text": doc["text"]} for doc in map(json.loads, list(fh)[:64])]
        late = admin.put("/collections/slow/documents", json={"documents": documents})
        assert late.status_code == 504 and "HYBRID_WRITE_TIMEOUT" in late.json()["detail"], late.text
        assert admin.get("/collections/slow/stats").json()["documents"] == 0  # nothing was written


@pytest.mark.parametrize(
    "path, body, loc",
    [
        ("/collections/tenant-a/search", {"query": "x", "vector": ["0.1", "0.2", "0.3", "0.4"]}, ["body", "vector", 0]),
        ("/collections", {"name": "typed", "settings": {"embedder": {"kind": "none", "dimension": "4"}}}, None),
        ("/collections/tenant-a/search", {"query": "x", "k": "5"}, ["body", "k"]),
    ],
)
@pytest.mark.server
def test_numbers_written_as_strings_are_refused(shared, path, body, loc):
    url, *_ = shared
    refused = httpx.post(f"{url}{path}", json=body, headers=ADMIN)
    assert refused.status_code == 422, refused.text
    assert "not a string" in json.dumps(refused.json())
    if loc is not None:
        assert refused.json()["detail"][0]["loc"] == loc


@pytest.mark.server
def test_a_vector_whose_norm_overflows_is_refused_saying_so(shared):
    url, *_ = shared
    refused = httpx.post(f"{url}/collections/tenant-a/search", json={"vector": [1e308] * DIMENSION, "mode": "dense"}, headers=ADMIN)
    assert refused.status_code == 422 and "overflows" in refused.json()["detail"][0]["msg"], refused.text
    # the same direction at a sane scale is searched
    assert (
        httpx.post(f"{url}/collections/tenant-a/search", json={"vector": [1.0] * DIMENSION, "mode": "dense"}, headers=ADMIN).status_code
        == 200
    )


# --- 12: temporary files ---------------------------------------------------------------------------------------------


def test_only_temporary_files_no_writer_holds_are_swept(tmp_path):
    import fcntl
    import os

    from hybrid_retrieval.common.publish import sweep_temporary

    stale = tmp_path / ".manifest.json.abc123.tmp"
    stale.write_text("{")
    live = tmp_path / ".manifest.json.def456.tmp"
    live.write_text("{")
    fd = os.open(live, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # as write_atomic holds its own
    try:
        assert sweep_temporary(tmp_path) == [stale]
        assert live.exists() and not stale.exists()
    finally:
        os.close(fd)


def test_logging_is_left_alone_by_the_onnx_export(caplog):
    """Unit-level half of item 11 (the whole export is tests/test_embedder.py's slow test)."""
    from hybrid_retrieval.models.onnx_export import _quiet

    root = logging.getLogger()
    before = root.level
    with _quiet("onnx_model", "fusion_base"):
        assert logging.getLogger("onnx_model").level == logging.WARNING
    assert root.level == before and logging.getLogger("onnx_model").level == logging.NOTSET


# --- the property: any mutation of a valid snapshot is refused whole, or restores the source ----------------------

MUTATIONS = st.one_of(
    st.tuples(st.just("truncate"), st.floats(0, 1)),
    st.tuples(st.just("flip"), st.floats(0, 1), st.integers(0, 7)),
    st.tuples(st.just("reforge-flip"), st.integers(0, 1000), st.floats(0, 1)),  # a member changed, every checksum redone
    st.tuples(st.just("reforge-drop"), st.integers(0, 1000)),
    st.tuples(st.just("reforge-rename"), st.integers(0, 1000), st.sampled_from(["collection/x.npy", "collection/live/wal.log", "x"])),
    st.tuples(st.just("reforge-extra"), st.sampled_from(["collection/extra.bin", "collection/live/other.log"]), st.integers(0, 4096)),
    st.tuples(st.just("reforge-oversized"), st.integers(1, 3)),  # a real member past the cap
    st.tuples(st.just("sparse"), st.integers(10**6, 10**10)),
    st.tuples(st.just("link"), st.sampled_from([tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.CHRTYPE, tarfile.FIFOTYPE, tarfile.DIRTYPE])),
    st.tuples(st.just("trailer"), st.sampled_from(["sequence", "documents", "id", "files", "manifest_sha256"])),
    st.just(("none",)),
)
CAP = 1 << 20


def mutate(archive: bytes, mutation: tuple, key: bytes | None) -> bytes:
    """`archive` changed as `mutation` says; the re-forged kinds recompute every checksum (and sign with `key`, which
    an attacker does not have: None)."""
    kind = mutation[0]
    if kind == "none":
        return archive
    if kind == "truncate":
        return archive[: int(len(archive) * mutation[1])]
    if kind == "flip":
        changed = bytearray(archive)
        changed[min(int(len(changed) * mutation[1]), len(changed) - 1)] ^= 1 << mutation[2]
        return bytes(changed)
    members, trailer = unpack(archive)
    names = list(members)
    extra: list[tuple[tarfile.TarInfo, bytes]] = []
    if kind == "reforge-flip":
        name = names[mutation[1] % len(names)]
        content = bytearray(members[name])
        if content:
            content[min(int(len(content) * mutation[2]), len(content) - 1)] ^= 0x10
        members[name] = bytes(content)
    elif kind == "reforge-drop":
        members.pop(names[mutation[1] % len(names)])
    elif kind == "reforge-rename":
        name = names[mutation[1] % len(names)]
        members[mutation[2]] = members.pop(name)
    elif kind == "reforge-extra":
        members[mutation[1]] = bytes(mutation[2])
    elif kind == "reforge-oversized":
        members["collection/oversized.bin"] = bytes(CAP * mutation[1])
    elif kind == "sparse":
        extra.append(sparse_member("collection/sparse.npy", mutation[1]))
    elif kind == "link":
        member = tarfile.TarInfo("collection/special")
        member.type, member.linkname = mutation[1], "/etc/passwd"
        extra.append((member, b""))
    elif kind == "trailer":
        trailer[mutation[1]] = {"files": {"../x": {"bytes": -1}}, "id": 7}.get(mutation[1], 10**6)
    return forge(members, trailer, extra)


@pytest.fixture(scope="module", params=[None, b"server-secret"], ids=["unsigned", "signed"])
def restoring(request, tmp_path_factory):
    """An in-process service (its writes are this process's) with a snapshot of a filled collection in its snapshot
    folder, a restore cap of CAP bytes, and (`signed`) a snapshot key."""
    from fastapi.testclient import TestClient

    from hybrid_retrieval.app.main import create_app
    from hybrid_retrieval.app.settings import Settings

    tmp_path = tmp_path_factory.mktemp("restoring")
    settings = Settings(
        data=tmp_path / "data",
        write_keys="admin-key",
        max_snapshot_bytes=CAP,
        snapshot_key=request.param.decode() if request.param else None,
        refresh_interval=0.1,
        compact_min_docs=100_000,
        verify="size",
    )
    with TestClient(create_app(settings), headers=ADMIN, raise_server_exceptions=False) as client:
        assert client.post("/collections", json=own_vectors("source")).status_code == 201
        fill(client, "source")
        taken = client.post("/collections/source/snapshots").json()
        archive = client.get(f"/collections/source/snapshots/{taken['id']}").content
        yield client, tmp_path / "data", archive, taken, request.param


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(mutation=MUTATIONS)
@pytest.mark.server
def test_a_mutated_snapshot_is_refused_whole_or_restores_the_source(restoring, mutation):
    client, data, archive, source, key = restoring
    crafted = mutate(archive, mutation, key)
    # in the snapshot folder, in place of the source's file (so no upload limit applies: the restore's own cap must)
    listed = data / "snapshots" / f"{source['id']}.snapshot"
    listed.write_bytes(crafted)
    before = listing(data / "collections")
    started = written_bytes()
    reply = client.post("/collections/target/snapshots/restore", json={"snapshot": source["id"]})
    written = written_bytes() - started
    listed.write_bytes(archive)
    assert reply.status_code in (201, 422), (mutation, reply.status_code, reply.text)
    assert written <= CAP + (1 << 20), (mutation, written)  # the cap, and a margin for the service's own logs and files
    if reply.status_code == 201:
        if key is not None or mutation == ("none",):  # signed: nobody but the server could have made it
            assert ranking(client, "target") == ranking(client, "source") and reply.json()["documents"] == source["documents"]
        else:  # forged consistently: it opened and replayed in staging, so it serves
            assert client.post("/collections/target/search", json={"query": "note", "mode": "bm25"}).status_code == 200
        assert client.delete("/collections/target").status_code == 204
    assert listing(data / "collections") == before, mutation  # nothing changed outside staging
    assert [p.name for p in (data / "collections").iterdir() if p.name.startswith(".")] == []  # no staging left


@pytest.mark.server
def test_a_forged_model_never_embeds_another_tenants_queries(tmp_path):
    """Model sessions and cached query embeddings are shared by the model files' content, not by the checksum a
    manifest claims: a restored collection whose manifest copies another tenant's model checksum over other weights
    (here the fp32 and int8 files swapped), opened first at the next start, leaves the other tenant's queries alone."""
    from fastapi.testclient import TestClient

    from hybrid_retrieval.app.main import create_app
    from hybrid_retrieval.app.settings import Settings

    settings = Settings(data=tmp_path / "data", write_keys="admin-key", refresh_interval=0.1, compact_min_docs=100_000, verify="size")
    query = {"query": "marsupials of australia", "mode": "dense", "k": 3}
    with TestClient(create_app(settings), headers=ADMIN) as client:
        assert client.post("/collections", json={"name": "tenant-b"}).status_code == 201
        texts = ["a quokka is a small marsupial", "the harbor lantern in the fog", "maple syrup from sap"]
        documents = [{"id": f"d{i}", "text": text} for i, text in enumerate(texts)]
        assert client.put("/collections/tenant-b/documents?wait=true", json={"documents": documents}).status_code == 200
        expected = [(hit["id"], hit["score"]) for hit in client.post("/collections/tenant-b/search", json=query).json()["hits"]]
        taken = client.post("/collections/tenant-b/snapshots?model=include").json()  # the model's files in it
        members, trailer = unpack(client.get(f"/collections/tenant-b/snapshots/{taken['id']}").content)
        fp32, int8 = "collection/model/model.onnx", "collection/model/model.int8.onnx"
        members[fp32], members[int8] = members[int8], members[fp32]
        manifest = json.loads(members["collection/manifest.json"])
        for name in (fp32, int8):
            manifest["files"][name.split("/", 1)[1]] = {"bytes": len(members[name]), "sha256": hashlib.sha256(members[name]).hexdigest()}
        members["collection/manifest.json"] = json.dumps(manifest).encode()
        trailer["manifest_sha256"] = hashlib.sha256(members["collection/manifest.json"]).hexdigest()
        assert upload(client, "aaa-forged", forge(members, trailer)).status_code == 201  # a model of its own: it opens
    with TestClient(create_app(settings), headers=ADMIN) as client:  # the forged collection opens first
        hits = client.post("/collections/tenant-b/search", json=query).json()["hits"]
        assert [(hit["id"], hit["score"]) for hit in hits] == expected
        # nor does a new collection of that model take the forged collection's files (a model name is no proof)
        assert client.post("/collections", json={"name": "aaa-new"}).status_code == 201
    collections = tmp_path / "data" / "collections"
    for name in ("model.onnx", "model.int8.onnx"):
        made = (collections / "aaa-new" / "model" / name).read_bytes()
        assert (
            made == (collections / "tenant-b" / "model" / name).read_bytes() != (collections / "aaa-forged" / "model" / name).read_bytes()
        )
