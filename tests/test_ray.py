"""Ray scale-out on a local Ray instance (2 CPUs, loopback only, started and stopped here): a Ray-built index is the
single-process build, and a 3-shard index served through Ray Serve answers like the whole index, even when Serve's
proxy misses Ray's own start-up wait."""

from __future__ import annotations

import itertools
import json
import shutil

import httpx
import numpy as np
import pytest

from hybrid_retrieval.evaluation.server import free_port
from hybrid_retrieval.indexer.build import BuildOptions, build_index
from hybrid_retrieval.indexer.manifest import update_manifest
from hybrid_retrieval.indexer.shards.split import split_index
from hybrid_retrieval.indexer.store import open_index
from tests.conftest import sample_queries, write_jsonl
from tests.test_shards import SPECS

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'hybrid-retrieval[ray]')")
pytestmark = [pytest.mark.ray, pytest.mark.slow]  # each test starts Ray or Serve: 20 to 45 s


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
    yield ray
    ray.shutdown()


@pytest.fixture
def serve_port(local_ray):
    """A free port for Ray Serve's HTTP proxy; Serve is shut down after the test (a running Serve instance keeps the
    port it started on, whatever the next `serve.start` asks for)."""
    from ray import serve

    yield free_port()
    serve.shutdown()


def test_a_ray_built_index_is_the_single_process_build(local_ray, scifact, tmp_path):
    from hybrid_retrieval.cluster.build import ray_embed
    from hybrid_retrieval.indexer.store import stored_vectors

    with (scifact / "corpus.jsonl").open() as fh:
        corpus = write_jsonl(tmp_path / "corpus.jsonl", [json.loads(line) for line in itertools.islice(fh, 120)])
    single = build_index(corpus, tmp_path / "single", BuildOptions(progress=False))
    distributed = build_index(corpus, tmp_path / "ray", BuildOptions(progress=False), embed=ray_embed(actors=2, block_docs=16))
    assert single.counts == distributed.counts and single.embedder == distributed.embedder
    different = {path for path, entry in single.files.items() if distributed.files[path]["sha256"] != entry["sha256"]}
    # every file but the FAISS index holding the vectors is byte for byte the same
    assert different <= {"dense.faiss"}
    assert {path for path in single.files if path.startswith(("bm25/", "postings/"))} and not {
        path for path in different if path.startswith(("bm25/", "postings/", "docs"))
    }
    np.testing.assert_allclose(stored_vectors(tmp_path / "ray"), stored_vectors(tmp_path / "single"), rtol=0, atol=1e-6)


def search(client, query, spec, k=20, headers=None):
    response = client.post("/search", json={"query": query, "k": k, **spec}, headers=headers)
    assert response.status_code == 200, response.text
    return response.json()


def test_ray_serve_answers_like_the_whole_index(serve_port, whole_index, scifact, tmp_path):
    from hybrid_retrieval.cluster.serve import serve_index

    whole_index = shutil.copytree(whole_index, tmp_path / "whole")  # its defaults change below
    sharded_index = tmp_path / "sharded"
    split_index(whole_index, sharded_index, 3)
    port = serve_port
    serve_index(sharded_index, port=port, replicas=2, api_keys="reader", write_keys="writer", verify="size")
    whole = open_index(whole_index)
    pipeline, reader = whole.pipeline(), {"X-API-Key": "reader"}
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
        for spec in SPECS:
            for query in sample_queries(scifact, 4, 100):
                expected = pipeline.search(query, 20, dict(spec))
                served = search(client, query, spec, headers=reader)
                assert [hit["id"] for hit in served["hits"]] == [whole.doc_ids[i] for i in expected.ranking.doc_idx], spec
                np.testing.assert_allclose([hit["score"] for hit in served["hits"]], expected.ranking.scores, rtol=0, atol=1e-5)
        assert client.post("/search", json={"query": "cells"}).status_code == 401  # keys hold on the ingress
        refused = client.put("/documents", json={"documents": [{"id": "x", "text": "new"}]}, headers={"X-API-Key": "writer"})
        assert refused.status_code == 409 and "fitted hubness correction takes no writes" in refused.json()["detail"]
        assert 'hybrid_requests_total{path="/search",status="200"}' in client.get("/metrics").text

        # hot reload: the index is split again with another default; the ingress reopens it, the replicas follow
        update_manifest(whole_index, lambda m: setattr(m, "defaults", m.defaults.merge({"fusion": {"method": "cc", "alpha": 0.3}})))
        split_index(whole_index, sharded_index, 3)
        reloaded = client.post("/admin/reload", headers={"X-API-Key": "writer"})
        assert reloaded.status_code == 200, reloaded.text
        assert client.get("/ready").json()["defaults"]["fusion"]["method"] == "cc"
        retuned = open_index(whole_index).pipeline()
        query = sample_queries(scifact, 1, 150)[0]
        served = search(client, query, {}, headers=reader)
        assert [hit["id"] for hit in served["hits"]] == [whole.doc_ids[i] for i in retuned.search(query, 20).ranking.doc_idx]


def test_writes_through_ray_serve_reach_the_owning_shard_and_every_replica(serve_port, metadata_index, scifact, tmp_path):
    """Writes through the ingress go to each shard's writer; the 2 search replicas of each shard follow its log (and
    its compaction), so every search, whichever replica answers, equals the whole index given the same writes."""
    from hybrid_retrieval.cluster.serve import serve_index
    from hybrid_retrieval.indexer.live.collection import Collection
    from tests.test_shard_writes import SPECS as WRITE_SPECS
    from tests.test_shard_writes import new_documents

    whole_index = shutil.copytree(metadata_index, tmp_path / "whole")
    sharded_index = tmp_path / "sharded"
    split_index(whole_index, sharded_index, 3)
    port = serve_port
    serve_index(sharded_index, port=port, replicas=2, write_keys="writer", verify="size")
    whole, writer = Collection(open_index(whole_index)), {"X-API-Key": "writer"}
    queries = sample_queries(scifact, 3, 300)
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as client:

        def write(method: str, path: str, body: dict) -> None:
            done = client.request(method, path + "?wait=true", json=body, headers=writer)
            assert done.status_code == 200 and done.json()["visible"], done.text

        def same_answers(rounds: int = 2) -> None:
            pipeline = whole.view.pipeline()
            for _ in range(rounds):  # calls go to either replica of a shard
                for spec in WRITE_SPECS:
                    for query in queries:
                        expected = pipeline.search(query, 20, dict(spec))
                        served = search(client, query, spec, headers=writer)
                        ids = [whole.view.document(int(i))["id"] for i in expected.ranking.doc_idx]
                        assert [hit["id"] for hit in served["hits"]] == ids, spec
                        np.testing.assert_allclose([hit["score"] for hit in served["hits"]], expected.ranking.scores, atol=1e-5)

        added = new_documents(scifact, 200, 12)
        removed = [open_index(whole_index).doc_ids[3], added[0]["id"]]
        write("PUT", "/documents", {"documents": added})
        write("POST", "/documents/delete", {"ids": removed})
        whole.upsert(added)
        whole.delete(removed)
        whole.refresh()
        same_answers()
        assert client.get(f"/documents/{added[1]['id']}", headers=writer).json()["text"] == added[1]["text"]
        assert client.get("/stats", headers=writer).json()["documents"] == whole.stats()["documents"] == 200 + 12 - 2

        compacted = client.post("/admin/compact", headers=writer)
        assert compacted.status_code == 200 and compacted.json()["live_documents"] == 0, compacted.text
        more = new_documents(scifact, 212, 4)
        write("PUT", "/documents", {"documents": more})
        whole.upsert(more)
        whole.refresh()
        same_answers()


def test_serve_comes_up_when_the_proxy_misses_rays_own_wait(serve_port, sharded_index, whole_index, scifact, monkeypatch, caplog):
    """A machine too busy for Ray's fixed wait on its HTTP proxy (60 s; here none at all): serving waits on Serve's
    status instead, and answers like the whole index."""
    from ray.serve._private import api, client

    from hybrid_retrieval.cluster.serve import serve_index

    for module in (api, client):  # what serve.start and serve.run wait for the proxy with
        monkeypatch.setattr(module, "HTTP_PROXY_TIMEOUT", 0)
    serve_index(sharded_index, port=serve_port, verify="size")
    # serve.start ("HTTP proxies ...") and serve.run ("Proxies ...") both gave up at once, and serving waited on
    assert caplog.text.count("roxies not available after 0s. Waiting up to") == 2, caplog.text
    whole = open_index(whole_index)
    with httpx.Client(base_url=f"http://127.0.0.1:{serve_port}", timeout=60) as http:
        for query in sample_queries(scifact, 2, 60):
            served = search(http, query, {"mode": "hybrid"}, k=10)
            expected = whole.pipeline().search(query, 10, {"mode": "hybrid"})
            assert [hit["id"] for hit in served["hits"]] == [whole.doc_ids[i] for i in expected.ranking.doc_idx]
