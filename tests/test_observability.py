import json
import logging
import re

import pytest
from fastapi.testclient import TestClient

from hybrid_retrieval.app.main import create_app
from hybrid_retrieval.app.observability import JsonFormatter, request_id_var
from hybrid_retrieval.app.settings import Settings
from hybrid_retrieval.indexer.store import open_index


@pytest.fixture(scope="module")
def client(tiny_index):
    with TestClient(create_app(Settings(), index=open_index(tiny_index))) as c:
        yield c


@pytest.mark.server
def test_request_id_is_echoed_or_generated(client):
    assert client.get("/health", headers={"X-Request-ID": "abc-123"}).headers["x-request-id"] == "abc-123"
    generated = client.get("/health", headers={"X-Request-ID": "bad id with spaces"}).headers["x-request-id"]
    assert len(generated) == 32 and generated != "bad id with spaces"


@pytest.mark.server
def test_metrics_expose_stage_histograms_status_counts_and_index(client):
    client.post("/search", json={"query": "cat on a mat", "k": 2})
    client.post("/search", json={"query": ""})
    text = client.get("/metrics").text
    for stage in ("bm25", "embed", "dense", "fusion", "total"):
        assert f'hybrid_stage_seconds_count{{stage="{stage}"}}' in text
    assert 'hybrid_requests_total{path="/search",status="200"}' in text
    assert 'hybrid_requests_total{path="/search",status="422"}' in text
    assert 'hybrid_index_documents{collection="index"} 6.0' in text  # the --index folder's collection
    assert "hybrid_index_info{" in text and 'model="sentence-transformers/all-MiniLM-L6-v2"' in text
    memory = float(re.search(r'hybrid_collection_memory_bytes\{collection="index"\} (\S+)', text).group(1))
    assert memory >= 6 * 384 * 4  # at least the flat FAISS index, which holds the vectors


def test_json_log_lines_carry_request_id_and_extras():
    token = request_id_var.set("req-9")
    try:
        record = logging.LogRecord("app.access", logging.INFO, __file__, 1, "request", None, None)
        record.status, record.ms = 200, 1.5
        line = json.loads(JsonFormatter().format(record))
    finally:
        request_id_var.reset(token)
    assert line["request_id"] == "req-9" and line["msg"] == "request" and line["status"] == 200 and line["ms"] == 1.5
