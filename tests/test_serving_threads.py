"""How the service spends its cores: search threads, model threads per search, the HTTP stack (app.settings)."""

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from hybrid_retrieval.app.main import create_app
from hybrid_retrieval.app.observability import request_id_var
from hybrid_retrieval.app.settings import Settings
from hybrid_retrieval.indexer.store import open_index
from hybrid_retrieval.models.batching import LoadAwareEmbedder

CORES = len(os.sched_getaffinity(0))


def test_thread_settings_are_validated():
    assert Settings(inference_threads="auto").inference_threads == "auto"
    assert Settings(inference_threads=str(CORES)).inference_threads == CORES  # as HYBRID_INFERENCE_THREADS gives it
    for bad in (0, CORES + 1, "many"):
        with pytest.raises(ValidationError, match="inference_threads"):
            Settings(inference_threads=bad)
    with pytest.raises(ValidationError, match=f"between 1 and the {CORES} cores"):
        Settings(inference_threads=CORES + 1)
    with pytest.raises(ValidationError, match="search_threads"):
        Settings(search_threads=0)
    assert Settings(reranker_workers="3").reranker_workers == 3  # as HYBRID_RERANKER_WORKERS gives it
    with pytest.raises(ValidationError, match="reranker_workers"):
        Settings(reranker_workers=0)
    assert Settings().search_workers == CORES + 1
    assert Settings(search_threads=7).search_workers == 7
    with pytest.raises(ValidationError, match="'auto', 'h11' or 'httptools'"):
        Settings(http="http2")
    with pytest.raises(ValidationError, match="'auto', 'asyncio' or 'uvloop'"):
        Settings(loop="trio")


def test_a_missing_http_package_is_named(monkeypatch):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "uvloop" else find_spec(name, *a))
    with pytest.raises(ValidationError, match="loop=uvloop needs the uvloop package"):
        Settings(loop="uvloop")
    assert Settings(loop="auto").loop == "auto"


class _Recorder:
    dimension = 2

    def __init__(self, name: str, calls: list):
        self.name, self.calls = name, calls

    def encode(self, texts, batch_size=32):
        self.calls.append(self.name)
        return np.zeros((len(texts), 2), np.float32)


def test_a_lone_search_gets_every_core_and_concurrent_ones_one_each():
    calls, busy = [], threading.Event()
    embedder = LoadAwareEmbedder(_Recorder("alone", calls), _Recorder("concurrent", calls), busy=busy.is_set)
    embedder.encode(["a"])
    busy.set()
    embedder.encode(["b"])
    assert calls == ["alone", "concurrent"]


@pytest.mark.server
def test_concurrent_searches_use_single_threaded_sessions(tiny_index):
    """Under load every search runs the model on one core; the vectors equal the all-core session's."""
    index = open_index(tiny_index, device="cpu")
    with TestClient(create_app(Settings(), index=index)) as client:
        app = client.app
        sessions = app.state.collections.resources._sessions  # (model checksum, precision, device, threads)
        expected = {("fp32", 1), (index.query_precision, None), (index.query_precision, 1)}
        assert {(precision, threads) for _, precision, _, threads in sessions} == expected
        queries = ["cat on a mat", "dogs and cats", "a mat", "stock prices"] * 4
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda q: client.post("/search", json={"query": q, "k": 3, "explain": True}).json(), queries))
        alone = {q: client.post("/search", json={"query": q, "k": 3, "explain": True}).json() for q in set(queries)}
    for query, answer in zip(queries, answers):
        assert [h["id"] for h in answer["hits"]] == [h["id"] for h in alone[query]["hits"]]
        np.testing.assert_allclose([h["score"] for h in answer["hits"]], [h["score"] for h in alone[query]["hits"]], atol=1e-5)


@pytest.mark.server
def test_searches_run_on_the_search_threads_with_the_request_id(tiny_index):
    """Log lines written during a search carry its request id (the request's context travels to the search thread)."""
    seen = []
    with TestClient(create_app(Settings(search_threads=2), index=open_index(tiny_index))) as client:
        pipeline = client.app.state.collections.default().serving.pipeline
        search = pipeline.search

        def recording(*args, **kwargs):
            seen.append((threading.current_thread().name, request_id_var.get()))
            return search(*args, **kwargs)

        pipeline.search = recording
        response = client.post("/search", json={"query": "cat", "k": 2}, headers={"X-Request-ID": "req-42"})
        assert client.post("/search/batch", json={"searches": [{"query": "cat"}]}).status_code == 200
    assert response.status_code == 200 and response.json()["hits"]
    assert seen[0] == ("search_0", "req-42") and seen[1][0].startswith("search_") and seen[1][1] not in ("req-42", "-")
