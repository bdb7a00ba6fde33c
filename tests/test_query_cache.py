"""The query-embedding cache: the same vectors as the model, keyed as the model sees a query, per model."""

from __future__ import annotations

import numpy as np
import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from hybrid_retrieval.app.main import create_app
from hybrid_retrieval.app.settings import Settings
from hybrid_retrieval.indexer.store import MODEL_DIR, open_index
from hybrid_retrieval.models.embedder import OnnxEmbedder
from hybrid_retrieval.models.query_cache import CachedEmbedder, QueryCache


@pytest.fixture(scope="module")
def embedder(tiny_index):
    return open_index(tiny_index).embedder


def test_a_hit_returns_the_vector_the_model_gives(embedder):
    cache = QueryCache(100)
    cached = CachedEmbedder(embedder, cache, "model-a")
    first, second = cached.encode(["statins and cancer"]), cached.encode(["statins and cancer"])
    direct = embedder.encode(["statins and cancer"])
    assert np.array_equal(first, direct) and np.array_equal(second, direct)
    assert (cache.hits, cache.misses) == (1, 1)
    second[0, 0] = 42.0  # a caller writing into its result does not touch the cache
    assert np.array_equal(cached.encode(["statins and cancer"]), direct)


def test_queries_the_tokenizer_sees_alike_share_an_entry(embedder):
    cache = QueryCache(100)
    cached = CachedEmbedder(embedder, cache, "model-a")
    cached.encode(["Statins   and CANCER"])  # the uncased model lowercases; whitespace only separates tokens
    cached.encode(["statins and cancer"])
    assert (cache.hits, cache.misses, len(cache)) == (1, 1, 1)


def test_another_model_never_hits(embedder):
    cache = QueryCache(100)
    CachedEmbedder(embedder, cache, "model-a").encode(["heart disease"])
    CachedEmbedder(embedder, cache, "model-b").encode(["heart disease"])  # a reload to another model: its own entries
    assert (cache.hits, cache.misses, len(cache)) == (0, 2, 2)


def test_a_batch_mixes_hits_and_misses_in_order(embedder):
    cache = QueryCache(100)
    cached = CachedEmbedder(embedder, cache, "m")
    cached.encode(["b query"])
    texts = ["a query", "b query", "c query"]
    np.testing.assert_allclose(cached.encode(texts), embedder.encode(texts), atol=1e-6)
    assert (cache.hits, cache.misses) == (1, 3)


def test_least_recently_used_goes_first_and_size_zero_keeps_nothing(embedder):
    cache = QueryCache(2)
    cached = CachedEmbedder(embedder, cache, "m")
    for text in ("one", "two", "one", "three"):  # "two" is the least recently used when "three" comes
        cached.encode([text])
    assert set(cache._entries) == set(cached.keys(["one", "three"]))
    off = QueryCache(0)
    CachedEmbedder(embedder, off, "m").encode(["one"])
    assert len(off) == 0
    with pytest.raises(ValidationError, match="query_cache_size"):
        Settings(query_cache_size=-1)


@pytest.mark.server
def test_the_service_counts_hits_in_metrics(tiny_index):
    with TestClient(create_app(Settings(query_cache_size=10), index=open_index(tiny_index))) as client:
        for _ in range(3):
            assert client.post("/search", json={"query": "cat on a mat", "k": 2}).status_code == 200
        text = client.get("/metrics").text
    assert 'hybrid_query_cache_lookups_total{result="hit"} 2.0' in text
    assert 'hybrid_query_cache_lookups_total{result="miss"} 1.0' in text
    assert "hybrid_query_cache_hit_ratio 0.666" in text


@pytest.mark.server
def test_the_service_embeds_queries_with_the_precision_asked(tiny_index):
    int8 = OnnxEmbedder(tiny_index / MODEL_DIR, device="cpu", precision="int8").encode(["cat on a mat"])[0]
    fp32 = OnnxEmbedder(tiny_index / MODEL_DIR, device="cpu").encode(["cat on a mat"])[0]
    assert not np.array_equal(int8, fp32)
    for precision, expected in (("auto", int8), ("int8", int8), ("fp32", fp32)):  # on CPU, auto means int8
        index = open_index(tiny_index, device="cpu", query_precision=precision)
        # offline tools (eval, tune, hubness fit) embed queries as the service does
        np.testing.assert_array_equal(index.pipeline().search("cat on a mat", k=1, spec={"mode": "dense"}).vector, expected)
        for threads in ("auto", 1, 2):  # single-threaded sessions compute the same vectors
            with TestClient(create_app(Settings(query_precision=precision, inference_threads=threads), index=index)) as client:
                result = client.app.state.collections.default().serving.pipeline.search("cat on a mat", k=1, spec={"mode": "dense"})
            np.testing.assert_allclose(result.vector, expected, atol=1e-6)
    with pytest.raises(ValidationError, match="query_precision"):
        Settings(query_precision="fp16")
