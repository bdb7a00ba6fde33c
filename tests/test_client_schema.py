"""No drift between the client and the server: every route the server serves has a client method (blocking and
async), and every body the client models has the fields the served OpenAPI schema gives it. A change made on the
server alone fails here (shown on a changed copy of the schema)."""

from __future__ import annotations

import copy
import inspect

import httpx
import pytest

from hybrid_retrieval.client import AsyncClient, Client, models
from hybrid_retrieval.evaluation.server import running_server

pytestmark = pytest.mark.server  # each test talks to the service (a process, or create_app in this one)

# each route -> the client method that calls it (the unprefixed routes act on the default collection: collection=None)
ROUTES = {
    ("GET", "/health"): "health",
    ("GET", "/ready"): "ready",
    ("GET", "/metrics"): "metrics",
    ("POST", "/admin/reload"): "reload",
    ("GET", "/collections"): "list_collections",
    ("POST", "/collections"): "create_collection",
    ("GET", "/collections/{name}"): "get_collection",
    ("DELETE", "/collections/{name}"): "drop_collection",
    ("PATCH", "/collections/{name}/settings"): "update_settings",
    ("GET", "/aliases"): "aliases",
    ("PUT", "/aliases/{alias}"): "set_alias",
    ("DELETE", "/aliases/{alias}"): "drop_alias",
    ("GET", "/tasks/{task_id}"): "task",
    ("GET", "/tasks"): "tasks",
    ("POST", "/collections/{name}/snapshots"): "create_snapshot",
    ("GET", "/collections/{name}/snapshots"): "snapshots",
    ("GET", "/snapshots"): "snapshots",
    ("GET", "/collections/{name}/snapshots/{snapshot_id}"): "download_snapshot",
    ("DELETE", "/collections/{name}/snapshots/{snapshot_id}"): "delete_snapshot",
    ("POST", "/collections/{name}/snapshots/restore"): "restore_snapshot",
    ("POST", "/search"): "search",
    ("POST", "/search/batch"): "search_batch",
    ("PUT", "/documents"): "upsert",  # and load (?wait=false, NDJSON)
    ("DELETE", "/documents/{doc_id}"): "delete_document",
    ("GET", "/documents/{doc_id}"): "get_document",
    ("POST", "/documents/delete"): "delete",
    ("GET", "/stats"): "stats",
    ("POST", "/admin/compact"): "compact",
    ("POST", "/collections/{name}/search"): "search",
    ("POST", "/collections/{name}/search/batch"): "search_batch",
    ("PUT", "/collections/{name}/documents"): "upsert",
    ("DELETE", "/collections/{name}/documents/{doc_id}"): "delete_document",
    ("GET", "/collections/{name}/documents/{doc_id}"): "get_document",
    ("POST", "/collections/{name}/documents/delete"): "delete",
    ("GET", "/collections/{name}/stats"): "stats",
    ("POST", "/collections/{name}/compact"): "compact",
}

# the client's models -> the server's schema components they mirror
MODELS = {
    models.RRF: "RRFBody",
    models.ConvexCombination: "CCBody",
    models.Hubness: "HubnessBody",
    models.Rerank: "RerankBody",
    models.Highlight: "HighlightBody",
    models.PassageScoring: "PassageScoringBody",
    models.Defaults: "DefaultsBody",
    models.GroupBy: "GroupByBody",
    models.SearchRequest: "SearchRequest",
    models.Component: "Component",
    models.RerankComponent: "RerankComponent",
    models.BoostContribution: "BoostContribution",
    models.Boosted: "Boosted",
    models.Explanation: "Explanation",
    models.Snippet: "Snippet",
    models.SemanticSentence: "SemanticSentence",
    models.HitHighlight: "HitHighlight",
    models.Passage: "Passage",
    models.GroupMember: "GroupMember",
    models.HitGroup: "HitGroup",
    models.Hit: "Hit",
    models.FacetValue: "FacetValue",
    models.TypoVariant: "TypoVariant",
    models.SearchResponse: "SearchResponse",
    models.BatchResponse: "BatchResponse",
    models.Document: "DocumentIn",
    models.StoredDocument: "DocumentOut",
    models.WriteResult: "WriteResult",
    models.Stats: "Stats",
    models.Task: "TaskInfo",
    models.EmbedderSettings: "EmbedderSettings",
    models.AnalyzerSettings: "AnalyzerSettings",
    models.SynonymRule: "SynonymRule",
    models.CurationRule: "CurationRuleBody",
    models.BM25Settings: "BM25Settings",
    models.VectorSettings: "VectorSettings",
    models.ChunkingSettings: "ChunkingSettings",
    models.CollectionSettings: "CollectionSettingsBody",
    models.CollectionSummary: "CollectionSummary",
    models.CollectionInfo: "CollectionInfo",
    models.Snapshot: "SnapshotOut",
    models.Ready: "Ready",
}

# bodies the client writes or reads inline (client.calls): their fields
ENVELOPES = {
    "CollectionCreate": {"name", "settings"},
    "CollectionList": {"collections"},
    "SettingsPatch": {"defaults", "synonyms", "curation"},
    "AliasSet": {"collection"},
    "AliasList": {"aliases"},
    "TaskList": {"tasks"},
    "SnapshotList": {"snapshots"},
    "SnapshotRestore": {"snapshot"},
    "BatchRequest": {"searches"},
    "DocumentBatch": {"documents"},
    "DeleteRequest": {"ids"},
    "Health": {"status"},
    "HTTPValidationError": {"detail"},
    "ValidationError": {"loc", "msg", "type", "input", "ctx"},
}


def _body(schema: dict, method: str, path: str) -> dict:
    """A route's JSON request body schema, written inline by the route (not a component)."""
    return schema["paths"][path][method.lower()]["requestBody"]["content"]["application/json"]["schema"]


# bodies the routes describe inline: where in the schema they are
INLINE = {
    "DocumentBatch": lambda schema: _body(schema, "PUT", "/collections/{name}/documents"),
    "DocumentIn": lambda schema: _body(schema, "PUT", "/collections/{name}/documents")["properties"]["documents"]["items"],
    "SnapshotRestore": lambda schema: _body(schema, "POST", "/collections/{name}/snapshots/restore"),
}


def _find(schema: dict, name: str) -> dict | None:
    try:
        return INLINE[name](schema) if name in INLINE else schema["components"]["schemas"][name]
    except KeyError:
        return None


def drift(schema: dict) -> list[str]:
    """What the client does not follow in `schema` (a served /openapi.json)."""
    problems = []
    served = {(method.upper(), path) for path, operations in schema["paths"].items() for method in operations}
    problems += [
        f"route {method} {path}: no client method (add it to the client and ROUTES)" for method, path in sorted(served - set(ROUTES))
    ]
    problems += [f"route {method} {path}: the server no longer serves it" for method, path in sorted(set(ROUTES) - served)]
    for model, name in MODELS.items():
        found = _find(schema, name)
        if found is None:
            problems.append(f"{name}: not in the schema (client model {model.__name__})")
            continue
        properties, required = set(found.get("properties", {})), set(found.get("required", []))
        fields = {info.alias or name for name, info in model.model_fields.items()}  # as sent: `from_` is `from`
        for field in sorted(properties - fields):
            problems.append(f"{name}.{field}: the server has it, client model {model.__name__} does not")
        for field in sorted(fields - properties):
            problems.append(f"{name}.{field}: client model {model.__name__} has it, the server does not")
        if issubclass(model, models._Response):  # what the server always sends, the client must require, and no more
            client_required = {info.alias or name for name, info in model.model_fields.items() if info.is_required()}
            for field in sorted(client_required ^ required):
                problems.append(f"{name}.{field}: required on one side only")
    for name, fields in ENVELOPES.items():
        found = _find(schema, name)
        if found is None:
            problems.append(f"{name}: not in the schema (an envelope of client.calls)")
        elif set(found.get("properties", {})) != fields:
            problems.append(f"{name}: fields {sorted(found.get('properties', {}))}, the client sends or reads {sorted(fields)}")
    known = set(MODELS.values()) | set(ENVELOPES)
    components = set(schema["components"]["schemas"])
    problems += [f"{name}: a schema component the client does not know" for name in sorted(components - known)]
    return problems


@pytest.fixture(scope="module")
def served_schema(tmp_path_factory) -> dict:
    env = {"HYBRID_DATA": str(tmp_path_factory.mktemp("schema") / "data"), "HYBRID_VERIFY": "size"}
    with running_server(None, env) as (url, _):
        return httpx.get(f"{url}/openapi.json").json()


def test_the_client_follows_the_served_schema(served_schema):
    assert drift(served_schema) == []
    for method in set(ROUTES.values()) | {"load", "iter_hits"}:
        assert callable(getattr(Client, method))
        assert inspect.iscoroutinefunction(getattr(AsyncClient, method)) or inspect.isasyncgenfunction(getattr(AsyncClient, method))
        assert inspect.signature(getattr(Client, method)).parameters == inspect.signature(getattr(AsyncClient, method)).parameters, method


def test_a_change_on_the_server_alone_fails(served_schema):
    changed = copy.deepcopy(served_schema)
    components = changed["components"]["schemas"]
    components["SearchResponse"]["properties"]["more"] = components["SearchResponse"]["properties"].pop("has_more")
    components["SearchResponse"]["required"] = [f if f != "has_more" else "more" for f in components["SearchResponse"]["required"]]
    components["Hit"]["required"].append("text")
    changed["paths"]["/collections/{name}/explode"] = {"post": {}}
    del changed["paths"]["/aliases"]
    assert drift(changed) == [
        "route POST /collections/{name}/explode: no client method (add it to the client and ROUTES)",
        "route GET /aliases: the server no longer serves it",
        "Hit.text: required on one side only",
        "SearchResponse.more: the server has it, client model SearchResponse does not",
        "SearchResponse.has_more: client model SearchResponse has it, the server does not",
        "SearchResponse.has_more: required on one side only",
        "SearchResponse.more: required on one side only",
    ]
