import pytest
from fastapi.testclient import TestClient

from hybrid_retrieval.app.main import create_app
from hybrid_retrieval.app.settings import Settings
from hybrid_retrieval.indexer.store import open_index

pytestmark = pytest.mark.server  # each test talks to the service (a process, or create_app in this one)

BODY = {"query": "cat on a mat", "k": 2, "mode": "bm25"}


@pytest.fixture(scope="module")
def index(tiny_index):
    return open_index(tiny_index)


@pytest.fixture
def keyed_client(index, tmp_path):
    (tmp_path / "keys").write_text("file-key-1\n\nfile-key-2\n")
    settings = Settings(api_keys="env-key", api_keys_file=tmp_path / "keys", cors_origins="https://app.example")
    with TestClient(create_app(settings, index=index)) as client:
        yield client


def test_missing_key_is_401(keyed_client):
    response = keyed_client.post("/search", json=BODY)
    assert response.status_code == 401 and response.headers["www-authenticate"] == "Bearer"


def test_wrong_key_is_403(keyed_client):
    assert keyed_client.post("/search", json=BODY, headers={"Authorization": "Bearer nope"}).status_code == 403
    assert keyed_client.post("/search", json=BODY, headers={"X-API-Key": "env-ke"}).status_code == 403


@pytest.mark.parametrize(
    "headers", [{"Authorization": "Bearer env-key"}, {"X-API-Key": "file-key-2"}, {"authorization": "bearer file-key-1"}]
)
def test_right_key_is_served(keyed_client, headers):
    response = keyed_client.post("/search", json=BODY, headers=headers)
    assert response.status_code == 200 and response.json()["hits"][0]["id"] == "d1"


def test_health_and_ready_stay_open(keyed_client):
    assert keyed_client.get("/health").status_code == 200
    assert keyed_client.get("/ready").status_code == 200


def test_cors_allows_only_configured_origins(keyed_client):
    allowed = keyed_client.options("/search", headers={"Origin": "https://app.example", "Access-Control-Request-Method": "POST"})
    assert allowed.headers.get("access-control-allow-origin") == "https://app.example"
    denied = keyed_client.options("/search", headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"})
    assert "access-control-allow-origin" not in denied.headers


def test_no_keys_configured_means_open(index):
    with TestClient(create_app(Settings(), index=index)) as client:
        assert client.post("/search", json=BODY).status_code == 200


def test_saturated_server_answers_503_with_retry_after(index):
    with TestClient(create_app(Settings(max_in_flight=1), index=index)) as client:
        slots = client.app.state.in_flight._slots
        assert slots.acquire(blocking=False)  # one search "in flight"
        try:
            response = client.post("/search", json=BODY)
            assert response.status_code == 503 and response.headers["retry-after"] == "1"
        finally:
            slots.release()
        assert client.post("/search", json=BODY).status_code == 200


def test_admin_endpoints_are_off_without_keys(index):
    with TestClient(create_app(Settings(), index=index)) as client:
        response = client.post("/admin/reload")
        assert response.status_code == 403 and "HYBRID_WRITE_KEYS" in response.json()["detail"]
