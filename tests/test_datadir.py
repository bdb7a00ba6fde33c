"""The data directory (names, creation, drops, aliases, what a crash leaves), collection settings, and the lifecycle
rules of the API that the end-to-end test does not walk through (defaults changed at run time, limits, bad loads)."""

from __future__ import annotations

import time

import numpy as np
import pytest
from fastapi.testclient import TestClient

from hybrid_retrieval.app.main import create_app
from hybrid_retrieval.app.settings import Settings
from hybrid_retrieval.common.errors import Conflict, HybridError, NotFound, SpecError
from hybrid_retrieval.common.names import check_name, name_of_folder
from hybrid_retrieval.indexer.build import BuildOptions
from hybrid_retrieval.indexer.datadir.layout import DataDir
from hybrid_retrieval.indexer.datadir.settings import CollectionSettings
from hybrid_retrieval.indexer.hubness import fit_hubness
from hybrid_retrieval.indexer.live.collection import Collection
from hybrid_retrieval.indexer.store import open_index
from hybrid_retrieval.search.dense import EXACT_BELOW, FaissParams
from hybrid_retrieval.search.hubness import HubnessParams
from tests.conftest import TINY_CORPUS, centroids

WRITER = {"X-API-Key": "w"}
DOCS = [{"id": d["_id"], "title": d["title"], "text": d["text"]} for d in TINY_CORPUS]


@pytest.mark.parametrize("name", ["a", "products-v2", "x_1", "9" * 64])
def test_valid_names(name):
    assert check_name(name) == name


@pytest.mark.parametrize("name", ["", "A", "-a", "_a", "a b", "a/b", "é", "9" * 65, 7])
def test_invalid_names_are_refused_naming_the_field(name):
    with pytest.raises(SpecError) as error:
        check_name(name, "name")
    assert error.value.field == "name"


def test_a_folder_served_from_outside_is_named_after_it(tmp_path):
    assert name_of_folder(tmp_path / "SciFact Index") == "scifact-index"
    assert name_of_folder(tmp_path / "---") == "default"


def test_create_drop_and_aliases_on_disk(tmp_path):
    data = DataDir(tmp_path)
    manifest = data.create("notes", CollectionSettings.parse({"bm25": {"k1": 1.2}, "filterable": ["year"]}))
    assert manifest.documents == 0 and manifest.bm25.k1 == 1.2 and manifest.filterable == ["year"]
    assert open_index(data.path("notes")).num_docs == 0 and data.names() == ["notes"]
    with pytest.raises(Conflict):
        data.create("notes", CollectionSettings())
    data.set_alias("current", "notes")
    with pytest.raises(Conflict):
        data.create("current", CollectionSettings())  # one namespace for both
    with pytest.raises(Conflict):
        data.drop("notes")  # the alias points to it
    with pytest.raises(NotFound):
        data.set_alias("other", "missing")
    assert DataDir(tmp_path).aliases == {"current": "notes"}  # kept on disk
    data.drop_alias("current")
    data.drop("notes")
    assert data.names() == [] and not data.path("notes").exists()
    with pytest.raises(NotFound):
        data.drop("x" * 300)  # a name no file system takes is no collection


def test_what_a_crash_leaves_is_removed_at_the_next_start(tmp_path):
    data = DataDir(tmp_path)
    leftovers = [data.collections / ".notes.building-x1", data.collections / ".dropped-old-1234"]
    for folder in leftovers:
        (folder / "bm25").mkdir(parents=True)
    DataDir(tmp_path)
    assert not any(folder.exists() for folder in leftovers)


def test_a_collection_a_crash_left_between_two_renames_is_put_back(tmp_path):
    """Without renameat2 a swap renames the old folder aside, then the new one in: a crash between the two leaves
    the collection missing and its previous folder (every acknowledged write) aside, which the next start puts back."""
    data = DataDir(tmp_path)
    data.create("notes", CollectionSettings())
    data.path("notes").rename(data.collections / ".notes.retired-ab12cd")
    (data.collections / ".notes.building-ef34gh" / "bm25").mkdir(parents=True)  # the new folder, never published
    again = DataDir(tmp_path)
    assert again.names() == ["notes"] and open_index(again.path("notes")).num_docs == 0
    assert sorted(p.name for p in again.collections.iterdir()) == ["notes"]


def test_a_damaged_aliases_file_is_refused_with_its_name(tmp_path):
    (tmp_path / "aliases.json").write_text("{oops")
    with pytest.raises(HybridError, match="aliases.json is not valid JSON"):
        DataDir(tmp_path)


@pytest.mark.parametrize(
    ("settings", "field"),
    [
        ({"shards": 2}, "settings.shards"),
        ({"embedder": {"kind": "none"}}, "settings.embedder.dimension"),
        ({"embedder": {"kind": "none", "dimension": 8, "model": "x"}}, "settings.embedder"),
        ({"embedder": {"dimension": 8}}, "settings.embedder.dimension"),
        ({"vectors": {"kind": "annoy"}}, "settings.vectors.kind"),
        ({"bm25": {"b": 2}}, "settings.bm25.b"),
        ({"defaults": {"filter": {"year": 2020}}}, "settings.defaults.filter"),
        ({"defaults": {"fusion": {"method": "cc", "alpha": 3}}}, "settings.defaults.fusion.alpha"),
        ({"filterable": "year"}, "settings.filterable"),
    ],
)
def test_invalid_settings_name_the_field(settings, field):
    with pytest.raises(SpecError) as error:
        CollectionSettings.parse(settings)
    assert error.value.field == field


def test_a_collection_starts_exact_and_takes_its_kind_past_the_threshold():
    hnsw = FaissParams(kind="hnsw", exact_below=100)
    assert hnsw.factory(99) == "Flat" and hnsw.factory(100) == "HNSW32,Flat"
    assert FaissParams(kind="ivf").factory(38) == "Flat"  # too few vectors to train one cluster
    assert CollectionSettings.parse({"vectors": {"kind": "hnsw"}}).vectors.exact_below == EXACT_BELOW
    default = CollectionSettings.parse({}).vectors
    assert (default.kind, default.exact_below) == ("ivf_sq8", EXACT_BELOW) == (BuildOptions().faiss.kind, BuildOptions().faiss.exact_below)


def test_a_compaction_keeps_the_clusters_it_trained_until_the_collection_outgrows_them(tmp_path):
    """An IVF collection trains its clusters at the compaction that crosses exact_below and the later ones reuse them
    (dense.trained.faiss) until the collection holds four times as many documents; searches stay exact cosines."""
    import faiss

    data = DataDir(tmp_path / "data")
    settings = {"embedder": {"kind": "none", "dimension": 8}, "vectors": {"kind": "ivf_sq8", "exact_below": 100, "nprobe": 512}}
    data.create("notes", CollectionSettings.parse(settings))
    vectors = np.random.default_rng(0).standard_normal((1200, 8)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    collection = Collection(open_index(data.path("notes"), verify="size"))
    factories, trained = [], []
    for upto in (60, 200, 400, 1200):  # clusters min(4 * sqrt(n), n // 39): none (flat), 5, 10 (reused: 5), 30
        first = collection.view.documents
        collection.upsert([{"id": f"n{i}", "text": f"note {i}", "vector": vectors[i].tolist()} for i in range(first, upto)])
        index = collection.compact().index
        factories.append(index.manifest.faiss.factory)
        file = index.path / "dense.trained.faiss"
        trained.append(faiss.read_index(str(file)) if file.exists() else None)
    assert factories == ["Flat", "IVF5,SQ8", "IVF5,SQ8", "IVF30,SQ8"]
    assert trained[0] is None and [t.nlist for t in trained[1:]] == [5, 5, 30]
    np.testing.assert_array_equal(centroids(trained[1]), centroids(trained[2]))
    view = collection.refresh()
    result = view.pipeline().search(None, k=5, spec={"mode": "dense"}, vector=vectors[7])
    expected = np.argsort(-(vectors @ vectors[7]), kind="stable")[:5]  # nprobe 512: every cluster scanned, then rescored
    assert [view.document(int(i))["id"] for i in result.ranking.doc_idx] == [f"n{i}" for i in expected]
    np.testing.assert_allclose(result.ranking.scores, (vectors @ vectors[7])[expected], rtol=1e-6)
    # a hubness correction's augmented vectors stay whole (IVF-Flat), through the compactions that carry it
    fit_hubness(collection.index, [], {"kind": "query log"}, HubnessParams(k=3), gallery_size=50, bank=vectors[:40])
    collection.close()
    collection = Collection(open_index(data.path("notes"), verify="size"))
    collection.upsert([{"id": "extra", "text": "extra", "vector": vectors[0].tolist()}])
    index = collection.compact().index
    augmented = faiss.read_index(str(index.path / index.manifest.hubness.folder / "dense.faiss"))
    assert type(faiss.downcast_index(augmented)).__name__ == "IndexIVFFlat" and augmented.ntotal == 1201
    corrected = (
        collection.refresh().pipeline().search(None, k=5, spec={"mode": "dense", "hubness": {"method": "qbnorm"}}, vector=vectors[7])
    )
    assert len(corrected.ranking) == 5
    collection.close()


@pytest.fixture
def client(tmp_path):
    with TestClient(create_app(Settings(data=tmp_path / "data", write_keys="w", refresh_interval=0.05, max_collections=2))) as c:
        yield c


@pytest.mark.server
def test_defaults_changed_through_the_api_are_served_and_kept(tmp_path, client):
    assert client.post("/collections", json={"name": "notes"}, headers=WRITER).status_code == 201
    assert client.put("/collections/notes/documents?wait=true", json={"documents": DOCS}, headers=WRITER).status_code == 200
    patched = client.patch("/collections/notes/settings", json={"defaults": {"mode": "bm25", "depth": 40}}, headers=WRITER)
    assert patched.status_code == 200 and patched.json()["defaults"]["mode"] == "bm25"
    assert client.post("/collections/notes/search", json={"query": "cat"}, headers=WRITER).json()["spec"]["mode"] == "bm25"
    refused = client.patch("/collections/notes/settings", json={"defaults": {"hubness": {"method": "qbnorm"}}}, headers=WRITER)
    assert refused.status_code == 422 and refused.json()["detail"][0]["loc"][:3] == ["body", "defaults", "hubness"]
    client.post("/collections/notes/compact", headers=WRITER).raise_for_status()
    with TestClient(create_app(Settings(data=tmp_path / "data", write_keys="w"))) as again:
        spec = again.post("/collections/notes/search", json={"query": "cat"}, headers=WRITER).json()["spec"]
        assert (spec["mode"], spec["depth"]) == ("bm25", 40)  # across a compaction and a restart


@pytest.mark.server
def test_limits_and_bad_loads(client):
    for name in ("a", "b"):
        assert client.post("/collections", json={"name": name}, headers=WRITER).status_code == 201
    full = client.post("/collections", json={"name": "c"}, headers=WRITER)
    assert full.status_code == 409 and "HYBRID_MAX_COLLECTIONS" in full.json()["detail"]
    bad = [*DOCS, {"id": "x", "text": ""}]
    refused = client.put("/collections/a/documents?wait=false", json={"documents": bad}, headers=WRITER)
    assert refused.status_code == 422 and refused.json()["detail"][0]["loc"] == ["body", "documents", len(DOCS), "text"]
    for not_a_list in (None, 3, {"id": "x"}):
        refused = client.put("/collections/a/documents?wait=false", json={"documents": not_a_list}, headers=WRITER)
        assert refused.status_code == 422 and refused.json()["detail"][0]["loc"] == ["body", "documents"]
    missing = client.put("/collections/nowhere/documents", json={"documents": DOCS}, headers=WRITER)
    assert missing.status_code == 404 and "a, b" not in missing.json()["detail"]  # names no other collection
    assert client.get("/tasks", headers=WRITER).json() == {"tasks": []}  # nothing was queued
    task = client.put("/collections/a/documents?wait=false", json={"documents": DOCS}, headers=WRITER).json()
    deadline = time.monotonic() + 60
    while client.get(f"/tasks/{task['id']}", headers=WRITER).json()["state"] != "succeeded":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert [t["id"] for t in client.get("/tasks?collection=a", headers=WRITER).json()["tasks"]] == [task["id"]]
    # one collection's tasks run in the order they came: the later version of an id wins
    versions = [[{"id": "d1", "text": f"version {n}"}, *DOCS[1:]] for n in range(4)]
    ids = [client.put("/collections/a/documents?wait=false", json={"documents": v}, headers=WRITER).json()["id"] for v in versions]
    while any(client.get(f"/tasks/{i}", headers=WRITER).json()["state"] != "succeeded" for i in ids):
        assert time.monotonic() < deadline + 60
        time.sleep(0.05)
    assert client.get("/collections/a/documents/d1", headers=WRITER).json()["text"] == "version 3"
    assert client.get("/tasks/nope", headers=WRITER).status_code == 404
    assert client.delete("/collections/b", headers=WRITER).status_code == 204
    metrics = client.get("/metrics", headers=WRITER).text  # an unscoped key sees every collection's series
    assert 'collection="b"' not in metrics and 'collection="a"' in metrics


@pytest.mark.server
def test_a_service_of_one_folder_creates_no_collection(tiny_index):
    with TestClient(create_app(Settings(write_keys="w"), index=open_index(tiny_index))) as client:
        refused = client.post("/collections", json={"name": "notes"}, headers=WRITER)
        assert refused.status_code == 409 and "--data" in refused.json()["detail"]
        assert [c["name"] for c in client.get("/collections", headers=WRITER).json()["collections"]] == ["index"]
