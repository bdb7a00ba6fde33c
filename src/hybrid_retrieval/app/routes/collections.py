"""Collections: create, list, describe, change defaults and synonyms, drop (indexer.datadir, through the engine).
Reads for a read key, changes for a write key; either only for the collections the key's scope names."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from hybrid_retrieval.app.json_body import CheckedRoute
from hybrid_retrieval.app.routes.documents import stats_of
from hybrid_retrieval.app.routes.shared import CollectionsDep, Name, scoped
from hybrid_retrieval.app.schemas.collections import CollectionCreate, CollectionInfo, CollectionList, CollectionSummary, SettingsPatch
from hybrid_retrieval.app.security import READ_KEY, WRITE_KEY, allowed, check_scope
from hybrid_retrieval.common.errors import Conflict, HybridError, NotFound
from hybrid_retrieval.common.names import check_name
from hybrid_retrieval.engine.collections import Collections, memory_bytes
from hybrid_retrieval.engine.serving import Reloader, Serving
from hybrid_retrieval.indexer.manifest import Manifest
from hybrid_retrieval.search.analyzer import Analyzer

CHANGE_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"description": "missing key"},
    403: {"description": "not a write key, or no write keys configured"},
    404: {"description": "no such collection or alias"},
    409: {"description": "the name is taken, an alias points to it, or the collection limit is reached"},
    422: {"description": "invalid name or settings; `loc` names the field"},
}
READ_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"description": "missing key"},
    403: {"description": "invalid key"},
    404: {"description": "no such collection"},
}

reads = APIRouter(route_class=CheckedRoute, dependencies=[READ_KEY], tags=["collections"])
writes = APIRouter(route_class=CheckedRoute, dependencies=[WRITE_KEY], tags=["collections"], responses=CHANGE_RESPONSES)


@writes.post("/collections", status_code=201, response_model=CollectionInfo)
def create_collection(body: CollectionCreate, collections: CollectionsDep, request: Request) -> CollectionInfo:
    """Create an empty collection; documents come with PUT /collections/{name}/documents."""
    name = check_name(body.name, "name")
    check_scope(request, name)
    return collection_info(collections, collections.create(name, body.settings_dict()))


@reads.get("/collections", response_model=CollectionList)
def list_collections(collections: CollectionsDep, request: Request) -> CollectionList:
    """The collections the key may use, those that cannot be opened among them (state `failed`, and why)."""
    summaries = []
    for name, reloader in sorted(collections.served.items()):
        if not allowed(request, name, *collections.aliases_of(name)):
            continue
        serving = reloader.serving
        writable = serving is not None and serving.collection is not None
        summaries.append(
            CollectionSummary(
                name=name,
                documents=serving.documents if serving is not None else 0,
                state="ready" if writable else "read-only",
                aliases=collections.aliases_of(name),
                error=None,
            )
        )
    for name, (why, _) in collections.failed.items():
        if allowed(request, name, *collections.aliases_of(name)):
            summaries.append(CollectionSummary(name=name, documents=0, state="failed", aliases=collections.aliases_of(name), error=why))
    return CollectionList(collections=sorted(summaries, key=lambda summary: summary.name))


@reads.get("/collections/{name}", response_model=CollectionInfo, responses=READ_RESPONSES)
def get_collection(name: Name, collections: CollectionsDep, request: Request) -> CollectionInfo:
    """Settings, counts, defaults and what they rest on, metadata fields, size on disk and in memory (an alias names
    the collection it points to)."""
    return collection_info(collections, scoped(request, name, lambda: collections.resolve(name)))


@writes.patch("/collections/{name}/settings", response_model=CollectionInfo)
def patch_settings(name: Name, body: SettingsPatch, collections: CollectionsDep, request: Request) -> CollectionInfo:
    """Change what needs no rebuild: the default search spec (rerank settings included), each field given replacing
    that field of the defaults, and the synonym and curation rules, each replaced whole. Served at once, kept across
    restarts and compactions."""
    reloader = scoped(request, name, lambda: collections.resolve(name))
    if body.defaults is not None or body.synonyms is not None or body.curation is not None:  # an empty body changes nothing
        reloader.change_settings(body.defaults_dict(), body.synonyms_list(), body.curation_list())
    return collection_info(collections, reloader)


@writes.delete("/collections/{name}", status_code=204)
def drop_collection(name: Name, collections: CollectionsDep, request: Request) -> Response:
    """Drop a collection and its files (refused while an alias points to it)."""
    check_scope(request, name)
    collections.drop(name)
    return Response(status_code=204)


def collection_info(collections: Collections, reloader: Reloader) -> CollectionInfo:
    """What GET /collections/{name} answers; NotFound when a concurrent drop (or restore) took the collection away
    while it was read, as if the request had come after."""
    serving = reloader.serving
    if serving is None:
        raise Conflict(f"collection {reloader.name!r} is not loaded")
    try:
        return _describe(collections, reloader, serving)
    except (OSError, HybridError):
        if collections.served.get(reloader.name) is not reloader or reloader.serving is not serving:
            raise NotFound(f"collection {reloader.name!r} was dropped or replaced while this answer was made") from None
        raise


def _describe(collections: Collections, reloader: Reloader, serving: Serving) -> CollectionInfo:
    manifest = serving.index.manifest
    return CollectionInfo(
        name=reloader.name,
        aliases=collections.aliases_of(reloader.name),
        documents=serving.documents,
        settings=settings_of(manifest),
        defaults=serving.pipeline.defaults.to_dict(),
        evidence=serving.evidence,
        fusion_tuning=asdict(manifest.fusion_tuning) if manifest.fusion_tuning else None,
        metadata={name: info.to_dict() for name, info in manifest.metadata.items()},
        curation=manifest.curation,
        stats=stats_of(serving),
        disk_bytes=serving.disk_bytes,
        memory_bytes=memory_bytes(reloader),
        created_at=manifest.created_at,
        index=str(serving.index.path),
    )


def settings_of(manifest: Manifest) -> dict[str, Any]:
    """A collection's settings in the shape `POST /collections` takes them, read back from its manifest."""
    return {
        "embedder": {
            "model": manifest.embedder.model,
            "profile": manifest.embedder.profile,
            "precision": manifest.embedder.document_precision,
            "dimension": manifest.embedder.dimension,
        },
        "analyzer": analyzer_settings(manifest.analyzer),
        "synonyms": manifest.synonyms,
        "bm25": {"k1": manifest.bm25.k1, "b": manifest.bm25.b},
        "vectors": {**manifest.faiss.params.to_dict(), "factory": manifest.faiss.factory},
        "filterable": manifest.filterable,
        "chunking": manifest.chunking.to_dict(),
    }


def analyzer_settings(analyzer: Analyzer) -> dict[str, Any]:
    """An analyzer as settings: a custom stop list as the list it is, a named one by its name."""
    fields = ("stemmer", "stopwords", "normalization", "fold_accents", "cjk", "lowercase")
    settings = {name: getattr(analyzer, name) for name in fields}
    if analyzer.stopwords == "custom":
        settings["stopwords"] = list(analyzer.stopword_list)
    return settings
