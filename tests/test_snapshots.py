"""Snapshots end to end against real server processes: a snapshot taken while a writer streams upserts and deletes
restores to exactly the writes acknowledged up to its sequence number; a restore on another data directory (another
machine) answers as the source does; damaged files are refused and change nothing; listing, download, deletion,
retention, replacement and metrics."""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import random
import subprocess
import sys
import tarfile
import threading
import time

import httpx
import numpy as np
import pytest

from hybrid_retrieval.common.errors import BadSnapshot
from hybrid_retrieval.evaluation.server import running_server
from hybrid_retrieval.indexer.datadir.layout import DataDir
from hybrid_retrieval.indexer.datadir.settings import CollectionSettings
from hybrid_retrieval.indexer.datadir.snapshots import extract, read_info
from hybrid_retrieval.indexer.live.collection import Collection
from hybrid_retrieval.indexer.live.log import log_path
from hybrid_retrieval.indexer.store import open_index
from hybrid_retrieval.indexer.wal import WriteAheadLog

WRITER = {"X-API-Key": "snapshot-writer"}
DIMENSION = 16
# a vocabulary large enough that two documents rarely tie on a BM25 score (ties are broken by internal position,
# which differs between a restored collection and one given the same writes)
WORDS = [f"{a}{b}" for a in ("ka", "lo", "mi", "nu", "pe", "ri", "so", "tu") for b in ("bar", "cet", "dov", "fim", "gul", "hox")]
QUERIES = ["kabar locet", "midov nufim pegul", "rihox", "sobar tucet kadov", "lofim migul"]


def env_for(data, **more: str) -> dict[str, str]:
    return {
        "HYBRID_DATA": str(data),
        "HYBRID_WRITE_KEYS": "snapshot-writer",
        "HYBRID_REFRESH_INTERVAL": "0.1",
        "HYBRID_VERIFY": "size",
        **more,
    }


def own_vectors(name: str) -> dict:
    return {"name": name, "settings": {"embedder": {"kind": "none", "dimension": DIMENSION}}}


def note(rng: random.Random, i: int) -> dict:
    words = rng.choices(WORDS, k=rng.randint(3, 30))
    return {"id": f"n{i}", "title": words[0], "text": " ".join(words), "vector": _vector(rng)}


def _vector(rng: random.Random) -> list[float]:
    return [rng.normalvariate(0, 1) for _ in range(DIMENSION)]


class Writer(threading.Thread):
    """Streams upserts (new ids and re-upserts) and deletes of a pool of ids until stopped; every acknowledged write
    is kept with its sequence number, in order."""

    def __init__(self, url: str, collection: str, seed: int = 7):
        super().__init__(daemon=True)
        self.url, self.collection, self.rng = url, collection, random.Random(seed)
        self.acknowledged: list[tuple[int, str, object]] = []  # (sequence, "upsert" | "delete", documents | ids)
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with httpx.Client(base_url=self.url, headers=WRITER, timeout=60) as client:
                while not self.stop.is_set():
                    if self.rng.random() < 0.75:
                        ids = {self.rng.randrange(300) for _ in range(self.rng.randint(1, 8))}
                        docs = [note(self.rng, i) for i in sorted(ids)]
                        reply = client.put(f"/collections/{self.collection}/documents", json={"documents": docs})
                        assert reply.status_code == 200, reply.text
                        self.acknowledged.append((reply.json()["sequence"], "upsert", docs))
                    else:
                        ids = sorted({f"n{self.rng.randrange(300)}" for _ in range(self.rng.randint(1, 3))})
                        reply = client.post(f"/collections/{self.collection}/documents/delete", json={"ids": ids})
                        assert reply.status_code == 200, reply.text
                        self.acknowledged.append((reply.json()["sequence"], "delete", ids))
        except BaseException as exc:  # seen by the test
            self.error = exc

    def wait_for(self, count: int, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while len(self.acknowledged) < count:
            assert self.error is None and self.is_alive(), self.error
            assert time.monotonic() < deadline, f"{len(self.acknowledged)} writes acknowledged, waited for {count}"
            time.sleep(0.02)


def replay(client: httpx.Client, collection: str, writes) -> None:
    for _, op, items in writes:
        if op == "upsert":
            reply = client.put(f"/collections/{collection}/documents", json={"documents": items})
        else:
            reply = client.post(f"/collections/{collection}/documents/delete", json={"ids": items})
        assert reply.status_code == 200, reply.text


def rankings(client: httpx.Client, collection: str) -> list:
    """Each query's complete hit list (id, score) in every mode. Equal scores are ordered by internal position,
    which differs between a restored collection and one given the same writes, so lists are compared up to ties
    (assert_same). Hybrid fuses by
    convex combination over complete candidate lists, where a tie in one leg stays a tie (under RRF tied documents
    get different ranks, so a tie order would change fused scores)."""
    rng = np.random.default_rng(3)
    found = []
    complete = {"k": 400, "depth": 400}
    for query in QUERIES:
        vector = rng.normal(size=DIMENSION).tolist()
        for body in ({"mode": "bm25"}, {"mode": "dense", "vector": vector}, {"fusion": {"method": "cc"}, "vector": vector}):
            reply = client.post(f"/collections/{collection}/search", json={"query": query, **complete, **body})
            assert reply.status_code == 200, reply.text
            found.append([(hit["id"], hit["score"]) for hit in reply.json()["hits"]])
    return found


def assert_same(client: httpx.Client, a: str, b: str) -> None:
    stats = [client.get(f"/collections/{name}/stats").json()["documents"] for name in (a, b)]
    assert stats[0] == stats[1]
    for first, second in zip(rankings(client, a), rankings(client, b), strict=True):
        # the same documents with the same scores, and each list in an order the other's scores agree with (tied
        # documents may come in either order)
        scores = dict(second)
        assert len(first) == len(second) and scores.keys() == {doc_id for doc_id, _ in first}
        assert np.allclose([s for _, s in first], [scores[doc_id] for doc_id, _ in first], atol=1e-5)
        assert all(scores[x] >= scores[y] - 1e-5 for (x, _), (y, _) in itertools.pairwise(first))
    for i in range(300):
        got = [client.get(f"/collections/{name}/documents/n{i}") for name in (a, b)]
        assert got[0].status_code == got[1].status_code
        if got[0].status_code == 200:
            assert got[0].json() == got[1].json()


def wait_visible(client: httpx.Client, collection: str, sequence: int) -> None:
    deadline = time.monotonic() + 30
    while client.get(f"/collections/{collection}/stats").json()["visible_sequence"] < sequence:
        assert time.monotonic() < deadline, "writes never became visible"
        time.sleep(0.05)


@pytest.mark.server
def test_a_snapshot_under_writes_restores_exactly_the_acknowledged_writes(tmp_path):
    # small compaction thresholds: compactions run while the writer writes and the snapshots are taken
    env = env_for(tmp_path / "data", HYBRID_COMPACT_MIN_DOCS="40", HYBRID_COMPACT_FRACTION="0.2")
    with running_server(None, env) as (url, _), httpx.Client(base_url=url, headers=WRITER, timeout=120) as client:
        assert client.post("/collections", json=own_vectors("notes")).status_code == 201
        writer = Writer(url, "notes")
        writer.start()
        snapshots = []
        try:
            # counted, not timed: each snapshot cuts the stream after at least 12 more acknowledged writes, and the
            # stream goes on for 12 more after the last one, however slow the machine
            for round_ in range(1, 4):
                writer.wait_for(12 * round_)
                if round_ < 3:
                    reply = client.post("/collections/notes/snapshots")
                    assert reply.status_code == 201, reply.text
                    snapshots.append(reply.json())
        finally:
            writer.stop.set()
            writer.join()
        assert writer.error is None, writer.error
        acknowledged = writer.acknowledged
        assert len(acknowledged) >= 36 and all(a[0] < b[0] for a, b in itertools.pairwise(acknowledged))
        for i, info in enumerate(snapshots):
            # every snapshot falls inside the stream, so it is a real cut of it
            assert acknowledged[0][0] <= info["sequence"] < acknowledged[-1][0], (info, acknowledged[0][0], acknowledged[-1][0])
            restored = client.post(f"/collections/restored-{i}/snapshots/restore", json={"snapshot": info["id"]})
            assert restored.status_code == 201, restored.text
            assert restored.json()["stats"]["last_sequence"] == info["sequence"]
            assert client.post("/collections", json=own_vectors(f"reference-{i}")).status_code == 201
            replay(client, f"reference-{i}", [w for w in acknowledged if w[0] <= info["sequence"]])
            wait_visible(client, f"reference-{i}", client.get(f"/collections/reference-{i}/stats").json()["last_sequence"])
            assert_same(client, f"restored-{i}", f"reference-{i}")
        listed = client.get("/collections/notes/snapshots").json()["snapshots"]
        assert [s["id"] for s in listed] == [s["id"] for s in snapshots]


@pytest.mark.server
def test_a_snapshot_moves_to_another_machine_and_damaged_files_change_nothing(tmp_path):
    docs = [
        {"id": f"d{i}", "title": f"title {i}", "text": text}
        for i, text in enumerate(
            [
                "a quokka is a small marsupial of western australia",
                "the harbor lantern guided ships through the fog",
                "maple syrup is made from the sap of maple trees",
                "quartz crystals oscillate at a precise frequency",
                "falcons dive faster than any other animal",
            ]
        )
    ]
    source_env = env_for(tmp_path / "source", HYBRID_SNAPSHOT_KEEP="2", HYBRID_MAX_SNAPSHOT_BYTES="4096")
    with running_server(None, source_env) as (url, _), httpx.Client(base_url=url, headers=WRITER, timeout=120) as client:
        assert client.post("/collections", json={"name": "facts"}).status_code == 201
        assert client.put("/collections/facts/documents?wait=true", json={"documents": docs[:3]}).status_code == 200
        first = client.post("/collections/facts/snapshots").json()
        assert client.put("/collections/facts/documents?wait=true", json={"documents": docs[3:]}).status_code == 200
        assert client.put("/aliases/facts-live", json={"collection": "facts"}).status_code == 200
        second = client.post("/collections/facts-live/snapshots").json()  # through an alias: the collection's
        assert (second["collection"], second["documents"], first["documents"]) == ("facts", 5, 3)
        expected = {q: client.post("/collections/facts/search", json={"query": q, "k": 5}).json()["hits"] for q in QUERIES}
        download = client.get(f"/collections/facts/snapshots/{second['id']}")
        assert download.status_code == 200 and download.headers["content-type"] == "application/x-tar"
        assert len(download.content) == second["bytes"]
        metrics = dict(line.rsplit(" ", 1) for line in client.get("/metrics").text.splitlines() if not line.startswith("#"))
        assert float(metrics['hybrid_snapshot_last_bytes{collection="facts"}']) == second["bytes"]
        assert float(metrics['hybrid_snapshot_last_timestamp_seconds{collection="facts"}']) > time.time() - 600
        # retention keeps the newest two of a collection
        third = client.post("/collections/facts/snapshots").json()
        assert [s["id"] for s in client.get("/collections/facts/snapshots").json()["snapshots"]] == [second["id"], third["id"]]
        assert client.delete(f"/collections/facts/snapshots/{third['id']}").status_code == 204
        assert client.get(f"/collections/facts/snapshots/{third['id']}").status_code == 404
        # restoring over an existing collection needs replace=true; the first snapshot then replaces it at once
        clash = client.post("/collections/facts/snapshots/restore", json={"snapshot": second["id"]})
        assert clash.status_code == 409
        too_large = client.post("/collections/big/snapshots/restore", content=b"x" * 5000, headers={"Content-Type": "application/x-tar"})
        assert too_large.status_code == 413
    snapshot_file = tmp_path / "copied.snapshot"
    snapshot_file.write_bytes(download.content)

    truncated = tmp_path / "truncated.snapshot"
    truncated.write_bytes(download.content[: len(download.content) // 2])
    flipped = bytearray(download.content)
    flipped[len(flipped) // 3] ^= 0x01
    flipped_file = tmp_path / "flipped.snapshot"
    flipped_file.write_bytes(bytes(flipped))
    for damaged in (truncated, flipped_file):
        with pytest.raises(BadSnapshot):
            read_info(damaged)

    with (
        running_server(None, env_for(tmp_path / "elsewhere")) as (url, _),
        httpx.Client(base_url=url, headers=WRITER, timeout=120) as client,
    ):
        upload = {"Content-Type": "application/octet-stream"}
        for damaged in (truncated, flipped_file):
            refused = client.post("/collections/facts/snapshots/restore", content=damaged.read_bytes(), headers=upload)
            assert refused.status_code == 422, refused.text
            assert refused.json()["detail"][0]["loc"] == ["body"]
        assert client.get("/collections").json()["collections"] == []  # nothing was created
        restored = client.post("/collections/facts/snapshots/restore", content=snapshot_file.read_bytes(), headers=upload)
        assert restored.status_code == 201, restored.text
        for query, hits in expected.items():
            assert client.post("/collections/facts/search", json={"query": query, "k": 5}).json()["hits"] == hits
        # it takes writes, and a damaged upload over it changes nothing
        assert (
            client.put("/collections/facts/documents?wait=true", json={"documents": [{"id": "x", "text": "a wombat"}]}).status_code == 200
        )
        refused = client.post("/collections/facts/snapshots/restore?replace=true", content=flipped_file.read_bytes(), headers=upload)
        assert refused.status_code == 422
        assert client.get("/collections/facts/documents/x").status_code == 200
        # an older snapshot replaces it in one step
        replaced = client.post("/collections/facts/snapshots/restore?replace=true", content=snapshot_file.read_bytes(), headers=upload)
        assert replaced.status_code == 201 and replaced.json()["documents"] == 5
        assert client.get("/collections/facts/documents/x").status_code == 404
        assert (
            client.put("/collections/facts/documents?wait=true", json={"documents": [{"id": "y", "text": "a numbat"}]}).status_code == 200
        )
        wrong_type = client.post("/collections/other/snapshots/restore", content=b"hello", headers={"Content-Type": "text/plain"})
        assert wrong_type.status_code == 415
        unknown = client.post("/collections/other/snapshots/restore", json={"snapshot": "facts-20990101T000000000000Z"})
        assert unknown.status_code == 404


def hybrid(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hybrid_retrieval.cli", *args], capture_output=True, text=True, timeout=300)


@pytest.mark.process
def test_offline_snapshot_commands(tmp_path):
    data = DataDir(tmp_path / "data")
    data.create("notes", CollectionSettings.parse({"embedder": {"kind": "none", "dimension": 4}}))
    collection = Collection(open_index(data.path("notes"), verify="size"))
    collection.upsert([{"id": f"n{i}", "text": f"note {i}", "vector": [1.0, i, 0.0, 0.5]} for i in range(12)])
    collection.delete(["n3"])
    collection.close()

    created = hybrid("snapshot", "create", "notes", "--data", str(data.root))
    assert created.returncode == 0, created.stderr
    info = json.loads(created.stdout)
    assert (info["collection"], info["sequence"], info["documents"]) == ("notes", 2, 11)
    data.create("untouched", CollectionSettings.parse({"embedder": {"kind": "none", "dimension": 4}}))  # never written: no log
    untouched = json.loads(hybrid("snapshot", "create", "untouched", "--data", str(data.root)).stdout)
    assert (untouched["sequence"], untouched["documents"]) == (0, 0)
    listed = hybrid("snapshot", "list", "--data", str(data.root), "--collection", "notes")
    assert [json.loads(line)["id"] for line in listed.stdout.splitlines()] == [info["id"]]
    verified = hybrid("snapshot", "verify", str(data.root / "snapshots" / f"{info['id']}.snapshot"))
    assert verified.returncode == 0 and json.loads(verified.stdout)["sequence"] == 2

    restored = hybrid("snapshot", "restore", info["id"], "--as", "copy", "--data", str(data.root))
    assert restored.returncode == 0, restored.stderr
    copy = Collection(open_index(data.path("copy"), verify="full"))
    assert (copy.seq, copy.view.documents, copy.get("n3"), copy.get("n4")["text"]) == (2, 11, None, "note 4")
    copy.close()
    again = hybrid("snapshot", "restore", info["id"], "--as", "copy", "--data", str(data.root))
    assert again.returncode == 2 and "exists" in again.stderr

    writer = WriteAheadLog(log_path(data.path("notes")), lock=True)  # as a running service that writes it holds it
    try:
        refused = hybrid("snapshot", "restore", info["id"], "--as", "notes", "--replace", "--data", str(data.root))
        assert refused.returncode == 2 and "running service" in refused.stderr
    finally:
        writer.close()
    assert hybrid("snapshot", "restore", info["id"], "--as", "notes", "--replace", "--data", str(data.root)).returncode == 0


def archive_with(tmp_path, members: dict[str, bytes]):
    path = tmp_path / "crafted.snapshot"
    with tarfile.open(path, "w") as tar:
        for name, content in members.items():
            member = tarfile.TarInfo(name)
            member.size = len(content)
            tar.addfile(member, io.BytesIO(content))
    return path


def test_files_that_are_not_snapshots_are_refused(tmp_path):
    for members in ({}, {"collection/manifest.json": b"{}"}, {"snapshot.json": b"not json"}, {"snapshot.json": b'{"check": "0"}'}):
        with pytest.raises(BadSnapshot):
            extract(archive_with(tmp_path, members), tmp_path / "out")
    (tmp_path / "plain.snapshot").write_bytes(b"hello")
    with pytest.raises(BadSnapshot):
        read_info(tmp_path / "plain.snapshot")
    # a member outside the collection's folder is refused even when the checksums agree
    described = {"id": "x-20260101T000000000000Z", "collection": "x", "sequence": 0, "documents": 0, "created_at": "", "format": 1}
    evil = {"collection/../escape": b"boom"}
    before_trailer = archive_with(tmp_path, evil).read_bytes()[:1024]  # the member's header block and data block
    trailer = {
        **described,
        "manifest_sha256": "",
        "files": {"../escape": {"bytes": 4, "sha256": hashlib.sha256(b"boom").hexdigest()}},
        "archive_sha256": hashlib.sha256(before_trailer).hexdigest(),
    }
    body = json.dumps({**trailer, "check": hashlib.sha256(json.dumps(trailer, sort_keys=True, separators=(",", ":")).encode()).hexdigest()})
    crafted = archive_with(tmp_path, {**evil, "snapshot.json": body.encode()})
    with pytest.raises(BadSnapshot, match="not a plain file of the collection"):
        extract(crafted, tmp_path / "out")
    assert not (tmp_path / "escape").exists()


@pytest.mark.server
def test_a_snapshot_references_its_model_unless_told_to_include_it(tmp_path):
    """A collection's model is most of its bytes (the int8 and fp32 MiniLM: about 114 MB): a snapshot references it by
    sha256 and restores where that model is; `model=include` copies it in, for a machine without it."""
    docs = [{"id": f"d{i}", "text": text} for i, text in enumerate(["a quokka smiles", "a falcon dives", "maple syrup boils"])]
    source_env = env_for(tmp_path / "source")
    with running_server(None, source_env) as (url, _), httpx.Client(base_url=url, headers=WRITER, timeout=120) as client:
        assert client.post("/collections", json={"name": "facts"}).status_code == 201
        assert client.put("/collections/facts/documents?wait=true", json={"documents": docs}).status_code == 200
        expected = client.post("/collections/facts/search", json={"query": "marsupial", "k": 3}).json()["hits"]
        referenced = client.post("/collections/facts/snapshots").json()
        included = client.post("/collections/facts/snapshots?model=include").json()
        files = {info["model"]: client.get(f"/collections/facts/snapshots/{info['id']}").content for info in (referenced, included)}
        for _ in range(5):  # the default retention keeps the newest five
            client.post("/collections/facts/snapshots")
        assert len(client.get("/collections/facts/snapshots").json()["snapshots"]) == 5
    assert len(files["referenced"]) < 1 << 20 < 50 << 20 < len(files["included"])

    upload = {"Content-Type": "application/octet-stream"}
    # a machine with neither a collection of that model nor its export
    bare = env_for(tmp_path / "bare", HYBRID_CACHE=str(tmp_path / "empty-cache"))
    with running_server(None, bare) as (url, _), httpx.Client(base_url=url, headers=WRITER, timeout=120) as client:
        refused = client.post("/collections/facts/snapshots/restore", content=files["referenced"], headers=upload)
        assert refused.status_code == 422 and "model=include" in refused.json()["detail"][0]["msg"], refused.text
        assert client.get("/collections").json()["collections"] == []
        restored = client.post("/collections/facts/snapshots/restore", content=files["included"], headers=upload)
        assert restored.status_code == 201, restored.text
        assert client.post("/collections/facts/search", json={"query": "marsupial", "k": 3}).json()["hits"] == expected
        # that model is here now: the referenced snapshot restores beside it
        copy = client.post("/collections/copy/snapshots/restore", content=files["referenced"], headers=upload)
        assert copy.status_code == 201, copy.text
        assert client.post("/collections/copy/search", json={"query": "marsupial", "k": 3}).json()["hits"] == expected
