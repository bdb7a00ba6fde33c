"""Writes on a sharded index: each document goes to the shard its id hashes to, BM25 scores with the corpus's
statistics summed over the shards, and every answer equals that of the whole index given the same writes."""

from __future__ import annotations

import itertools
import json
import shutil

import numpy as np
import pytest
from fastapi.testclient import TestClient

from hybrid_retrieval.app.main import create_app
from hybrid_retrieval.app.settings import Settings
from hybrid_retrieval.common.errors import HybridError
from hybrid_retrieval.indexer.live.collection import Collection
from hybrid_retrieval.indexer.shards.layout import read_shards, shard_of
from hybrid_retrieval.indexer.shards.open import open_sharded
from hybrid_retrieval.indexer.shards.split import split_index
from hybrid_retrieval.indexer.shards.writes import ShardedCollection
from hybrid_retrieval.indexer.store import open_index
from hybrid_retrieval.search.curation import Curation
from hybrid_retrieval.search.segments import CorpusStatistics
from tests.conftest import SHARDED_SLICE as SLICE
from tests.conftest import STEERED_SPECS, sample_queries, with_metadata

SPECS = [
    {"mode": "bm25"},
    {"mode": "dense"},
    {"mode": "hybrid"},
    {"mode": "hybrid", "fusion": {"method": "rrf", "rrf_k": 10}, "depth": 30},
    {"mode": "hybrid", "fusion": {"method": "cc", "norm": "zscore", "alpha": 0.6}},
    {"mode": "hybrid", "filter": {"year": {"gte": 2005}}},
    {"mode": "bm25", "filter": {"tags": "b"}},
    {"mode": "dense", "filter": {"$not": {"flag": True}}},
    {"mode": "bm25", "text_fields": {"title": 3, "text": 1}},
    {"mode": "hybrid", "text_fields": {"title": 2, "text": 0.5}},
    *STEERED_SPECS,
]


@pytest.fixture
def pair(metadata_index, tmp_path):
    """The whole index and its 3-shard split, both writable (copies: the tests write to them)."""
    whole = tmp_path / "whole"
    shutil.copytree(metadata_index, whole)
    split_index(whole, tmp_path / "sharded", 3)
    return whole, tmp_path / "sharded"


def new_documents(scifact, start: int, count: int) -> list[dict]:
    with (scifact / "corpus.jsonl").open() as fh:
        docs = [json.loads(line) for line in itertools.islice(fh, start, start + count)]
    return [
        {"id": d["_id"], "title": d["title"], "text": d["text"], "metadata": with_metadata(start + i, d)["metadata"]}
        for i, d in enumerate(docs)
    ]


def ids_and_scores(pipeline, ids_of, query: str, spec: dict, k: int = 20):
    result = pipeline.search(query, k, dict(spec))
    return ids_of(result.ranking.doc_idx), result.ranking.scores


def assert_same_answers(whole_view, sharded, queries) -> int:
    pw, ps = whole_view.pipeline(), sharded.pipeline()
    whole_ids = lambda idx: [whole_view.document(int(i))["id"] for i in idx]
    sharded_ids = lambda idx: [doc["id"] for doc in sharded.documents(idx)]
    compared = 0
    for spec in SPECS:
        for query in queries:
            ids_a, scores_a = ids_and_scores(pw, whole_ids, query, spec)
            ids_b, scores_b = ids_and_scores(ps, sharded_ids, query, spec)
            assert ids_b == ids_a, (spec, query)
            np.testing.assert_allclose(scores_b, scores_a, rtol=0, atol=1e-5, err_msg=str((spec, query)))
            compared += 1
    return compared


@pytest.mark.slow
def test_writes_go_to_the_owning_shard_and_answers_equal_the_whole_index(pair, scifact):
    whole_path, sharded_path = pair
    whole = Collection(open_index(whole_path))
    sharded = open_sharded(sharded_path)
    writes = ShardedCollection(sharded, max_batch_docs=100)
    queries = sample_queries(scifact, 8, 300)
    queries[-2:] = [q.replace(w, w[:2] + w[3] + w[2] + w[4:], 1) for q in queries[-2:] for w in [max(q.split(), key=len)]]  # typos
    try:
        added = new_documents(scifact, SLICE, 30)
        base_ids = open_index(whole_path).doc_ids
        changed = {**new_documents(scifact, 3, 1)[0], "text": "Vitamin D and bone density in elderly women"}
        for batch in (added[:20], [changed, *added[20:]]):
            whole.upsert(batch)
            writes.upsert(batch)
        for ids in ([base_ids[5], base_ids[6], base_ids[7]], [added[0]["id"]]):
            whole.delete(ids)
            writes.delete(ids)
        whole.refresh()
        writes.refresh()
        # each document is in the shard its id hashes to, and nowhere else
        owner = int(shard_of([added[1]["id"]], 3)[0])
        for shard, client in enumerate(sharded.shards.clients):
            assert (client.document_by_id(added[1]["id"]) is not None) == (shard == owner)
        assert writes.get(changed["id"])["text"] == changed["text"] and writes.get(added[0]["id"]) is None
        assert writes.stats()["documents"] == whole.stats()["documents"] == SLICE + 30 - 3 - 1
        # BM25's statistics are the corpus's, summed over the shards
        terms = ["vitamin", "bone", "cell"]
        parts = [client.statistics(terms) for client in sharded.shards.clients]
        expected = whole.view.pipeline().bm25
        total = CorpusStatistics.total(parts)
        assert (total.documents, total.length) == (expected.collection_size, expected.total_length)
        assert total.df == {t: expected.df(t) for t in terms}
        assert assert_same_answers(whole.view, sharded, [changed["text"], *queries]) == 9 * len(SPECS)
        # pins and hidden documents, written ones among them, found in the shards as in the whole index
        curation = Curation((added[5]["id"], base_ids[10], added[0]["id"]), (added[6]["id"], base_ids[5]))  # added[0] deleted
        pw, ps = whole.view.pipeline(), sharded.pipeline()
        for query in queries[:3]:
            a, b = pw.search(query, 10, {}, curation=curation), ps.search(query, 10, {}, curation=curation)
            assert [whole.view.document(int(i))["id"] for i in a.ranking.doc_idx] == [d["id"] for d in sharded.documents(b.ranking.doc_idx)]
            assert len(b.pinned) == 2 and added[6]["id"] not in [d["id"] for d in sharded.documents(b.ranking.doc_idx)]

        # compaction of every shard keeps the answers; writes after it too; reopening replays every shard's log
        writes.compact()
        whole.compact()
        more = new_documents(scifact, SLICE + 30, 5)
        whole.upsert(more)
        writes.upsert(more)
        whole.refresh()
        writes.refresh()
        assert all(
            not client.collection.view.live.docs or client.collection.view.live.docs[0].position >= SLICE
            for client in sharded.shards.clients
        )
        assert assert_same_answers(whole.view, sharded, queries[:4]) == 4 * len(SPECS)
    finally:
        sharded.close()
        whole.close()
    reopened = open_sharded(sharded_path)
    try:
        assert reopened.written and reopened.next_position == SLICE + 30 + 1 + 5  # every upserted version took a position
        assert assert_same_answers(Collection(open_index(whole_path)).view, reopened, queries[:4]) == 4 * len(SPECS)
    finally:
        reopened.close()


@pytest.mark.slow  # a split index and a server: 17 s
def test_the_service_writes_to_a_sharded_index(pair, scifact):
    whole_path, sharded_path = pair
    writer = {"X-API-Key": "writer"}
    added = new_documents(scifact, SLICE, 6)
    whole = TestClient(create_app(Settings(index=whole_path, write_keys="writer")))
    sharded = TestClient(create_app(Settings(index=sharded_path, write_keys="writer")))
    with whole, sharded:
        for client in (whole, sharded):
            done = client.put("/documents?wait=true", json={"documents": added}, headers=writer)
            assert done.status_code == 200 and done.json()["visible"], done.text
            assert client.post("/documents/delete?wait=true", json={"ids": [added[2]["id"]]}, headers=writer).status_code == 200
        for query in [added[0]["title"], *sample_queries(scifact, 3, 200)]:
            body = {"query": query, "k": 8, "mode": "hybrid", "facets": ["tags"], "highlight": True}
            a, b = (c.post("/search", json=body, headers=writer).json() for c in (whole, sharded))
            assert [h["id"] for h in b["hits"]] == [h["id"] for h in a["hits"]] and a["facets"] == b["facets"]
            np.testing.assert_allclose([h["score"] for h in b["hits"]], [h["score"] for h in a["hits"]], atol=1e-5)
        assert sharded.get(f"/documents/{added[0]['id']}", headers=writer).json()["text"] == added[0]["text"]
        assert sharded.get(f"/documents/{added[2]['id']}", headers=writer).status_code == 404
        stats = sharded.get("/stats", headers=writer).json()
        assert stats["writable"] and stats["documents"] == SLICE + 5 == whole.get("/stats", headers=writer).json()["documents"]
        bad = sharded.put("/documents", json={"documents": [{"id": "x"}]}, headers=writer)
        assert bad.status_code == 422 and "documents[0].text" in bad.text
        # after a reload the new collection takes the shards' logs over, and numbers after every write so far
        assert sharded.post("/admin/reload", headers=writer).status_code == 200
        later = new_documents(scifact, SLICE + 6, 3)
        assert sharded.put("/documents?wait=true", json={"documents": later}, headers=writer).status_code == 200
        assert sharded.get("/stats", headers=writer).json()["documents"] == SLICE + 5 + 3
    logged = {i for i, s in enumerate(read_shards(sharded_path)["shards"]) if (sharded_path / s["folder"] / "live" / "wal.log").exists()}
    assert logged == set(shard_of([doc["id"] for doc in added + later], 3).tolist())  # only the owning shards were written


def test_a_shard_that_fails_a_write_leaves_the_other_shards_parts_published(pair, scifact, monkeypatch):
    _, sharded_path = pair
    sharded = open_sharded(sharded_path)
    writes = ShardedCollection(sharded, max_batch_docs=100)
    try:
        added = new_documents(scifact, SLICE, 12)
        owners = shard_of([doc["id"] for doc in added], 3)
        broken = int(owners[0])

        def full_disk(*_):
            raise OSError("no space left on device")

        monkeypatch.setattr(sharded.writers.clients[broken], "upsert", full_disk)
        with pytest.raises(HybridError, match="positions must follow the last one this shard holds"):
            sharded.writers.clients[(broken + 1) % 3].upsert([added[1]], [0])  # a position the split gave
        with pytest.raises(OSError, match="no space"):
            writes.upsert(added)
        writes.refresh()
        for doc, owner in zip(added, owners):
            assert (writes.get(doc["id"]) is not None) == (owner != broken)
        assert writes.seq == writes.view.seq == len(set(owners.tolist()) - {broken})  # one write in each other shard
        assert writes.stats()["documents"] == SLICE + int((owners != broken).sum())
    finally:
        sharded.close()
