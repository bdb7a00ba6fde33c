"""HTTP routes: thin translation between JSON and the search pipeline."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi import Path as PathParam
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel

from hybrid_retrieval.app.json_body import CheckedRoute
from hybrid_retrieval.app.schemas import BatchRequest, BatchResponse, Health, Ready, SearchRequest, SearchResponse
from hybrid_retrieval.app.security import (
    Keys,
    allowed,
    check_scope,
    presented_grant,
    presented_key,
    require_api_key,
    require_unscoped_write_key,
)
from hybrid_retrieval.common.errors import NotFound, SpecError
from hybrid_retrieval.engine.collections import Collections
from hybrid_retrieval.engine.serving import Reloader, ReloadInProgress, Serving
from hybrid_retrieval.search import budget
from hybrid_retrieval.search.pipeline import Query
from hybrid_retrieval.search.vectors import check_vector

service_router = APIRouter(route_class=CheckedRoute)  # bodies parsed by app.json_body


def collections_of(request: Request) -> Collections:
    collections = request.app.state.collections
    if collections is None:
        raise HTTPException(status_code=503, detail="the service is starting", headers={"Retry-After": "1"})
    return collections


def _serving_of(reloader: Reloader) -> Serving:
    serving = reloader.serving  # read once: the whole request uses one index
    if serving is None:
        raise HTTPException(status_code=503, detail=f"collection {reloader.name!r} is not loaded", headers={"Retry-After": "1"})
    return serving


async def default_collection(request: Request) -> Reloader:
    """The unprefixed routes' collection (HYBRID_DEFAULT_COLLECTION)."""
    collections = collections_of(request)
    return scoped(request, collections.default_name, collections.default)


async def named_collection(
    request: Request, name: Annotated[str, PathParam(description="a collection, or an alias of one", examples=["products"])]
) -> Reloader:
    collections = collections_of(request)
    return scoped(request, name, lambda: collections.resolve(name))


def scoped(request: Request, name: str, resolve: Callable[[], Reloader]) -> Reloader:
    """The collection `name` resolves to, if the request's key may use it (by that name, or the collection's own);
    403 naming it otherwise, also when it does not exist (a key learns nothing outside its scope)."""
    if allowed(request, name):
        return resolve()
    try:
        reloader = resolve()
    except NotFound:
        reloader = None
    check_scope(request, name, *([reloader.name] if reloader is not None else []))
    assert reloader is not None  # check_scope raised otherwise
    return reloader


def serving_of(collection: Callable) -> Callable:
    """A dependency: what the collection that the dependency `collection` resolves serves now (read once per request)."""

    # a default value, not an annotation: FastAPI reads annotations by name, and `collection` is this closure's
    async def serving(reloader: Reloader = Depends(collection)) -> Serving:
        return _serving_of(reloader)

    return serving


async def _in_flight(request: Request):
    with request.app.state.in_flight.slot():
        yield


_SEARCH_RESPONSES = {
    401: {"description": "missing API key"},
    403: {"description": "invalid API key"},
    404: {"description": "no such collection"},
    413: {"description": "body too large"},
    422: {"description": "invalid request; `loc` names the field"},
    503: {"description": "busy or not ready; see Retry-After"},
}


def search_routes(collection: Callable) -> APIRouter:
    """POST /search and /search/batch over the collection the dependency `collection` resolves."""
    router = APIRouter(route_class=CheckedRoute)
    current = Depends(serving_of(collection))  # a default value: see serving_of

    @router.post(
        "/search", response_model=SearchResponse, dependencies=[Depends(require_api_key), Depends(_in_flight)], responses=_SEARCH_RESPONSES
    )
    async def search(body: SearchRequest, request: Request, serving: Serving = current) -> Response:
        def run() -> Response:
            shown = _presentation(serving, body)
            vector = query_vector(serving, body)
            group_by = _group_by(serving, body)
            result = serving.pipeline.search(body.query, k=body.k, spec=body.spec(), offset=body.offset, vector=vector, group_by=group_by)
            request.app.state.metrics.observe_search(result.timings_ms)
            return json_response(_response(serving, body, result, shown))

        return await off_loop(request, run)

    @router.post(
        "/search/batch",
        response_model=BatchResponse,
        dependencies=[Depends(require_api_key), Depends(_in_flight)],
        responses=_SEARCH_RESPONSES,
    )
    async def search_batch(body: BatchRequest, request: Request, serving: Serving = current) -> Response:
        """Up to 64 searches in one call, their queries embedded in one model run; all checked before any runs."""

        def run() -> Response:
            started = time.perf_counter()
            shown, queries = [], []
            for i, item in enumerate(body.searches):
                try:
                    shown.append(_presentation(serving, item))
                    vector, group_by = query_vector(serving, item), _group_by(serving, item)
                    queries.append(Query(item.query, item.k, item.spec(), item.offset, vector, group_by))
                except SpecError as exc:
                    raise exc.within(f"searches[{i}]") from None
            results = serving.pipeline.search_many(queries)
            responses = []
            for item, result, presentation in zip(body.searches, results, shown):
                request.app.state.metrics.observe_search(result.timings_ms)
                responses.append(_response(serving, item, result, presentation))
            return json_response(BatchResponse(results=responses, timings_ms={"total": round((time.perf_counter() - started) * 1000, 3)}))

        return await off_loop(request, run)

    return router


async def off_loop(request: Request, work: Callable[[], Response]) -> Response:
    """Run a search on the service's search threads (HYBRID_SEARCH_THREADS), in the request's context (its request id
    reaches the log lines), under its deadline (HYBRID_REQUEST_TIMEOUT): past it the work stops and the answer is
    504. A plain executor future: FastAPI's own thread hop for sync routes costs more CPU per request than a BM25
    search (docs/BENCHMARKS.md, "Concurrent serving")."""
    deadlines = request.app.state.deadlines
    with deadlines.start(deadlines.search_seconds) as deadline:

        def run() -> Response:
            with budget.within(deadline):
                deadline.check("waiting for a search thread")
                return work()

        call = functools.partial(contextvars.copy_context().run, run)
        try:
            return await asyncio.get_running_loop().run_in_executor(request.app.state.search_executor, call)
        except asyncio.CancelledError:  # the server gave up on the request (a stop): its work stops too
            deadline.cancel("the request was cancelled")
            raise


def json_response(model: BaseModel) -> Response:
    """The response model as JSON, serialised once by pydantic (returning the model would validate it a second time)."""
    return Response(model.model_dump_json(), media_type="application/json")


def query_vector(serving: Serving, body: SearchRequest):
    """The request's own query vector, checked against the collection's dimension (422 naming `vector`)."""
    return check_vector(body.vector, serving.pipeline.dense.dimension, "vector") if body.vector is not None else None


def _group_by(serving: Serving, body: SearchRequest):
    return serving.pipeline.check_group_by(body.group_by.model_dump() if body.group_by is not None else None)


@dataclass(frozen=True)
class Presentation:
    """What a request asks to see of its hits, checked against the served index (422 naming the field)."""

    fields: list[str] | str | None
    facets: list[str] | None
    passages: int


def _presentation(serving: Serving, body: SearchRequest) -> Presentation:
    presenter = serving.presenter
    return Presentation(presenter.check_fields(body.fields), presenter.check_facets(body.facets), presenter.check_passages(body.passages))


def _response(serving: Serving, body: SearchRequest, result, shown: Presentation) -> SearchResponse:
    presenter = serving.presenter
    hits = presenter.hits(
        result, body.query or "", include_text=body.include_text, explain=body.explain, fields=shown.fields, passages=shown.passages
    )
    return SearchResponse(
        query=body.query,
        k=body.k,
        offset=result.offset,
        has_more=result.has_more,
        spec=result.spec.to_dict(),
        hits=hits,
        facets=presenter.facets(result, shown.facets),
        reranker=serving.pipeline.reranker.name if result.reranked else None,
        timings_ms={stage: round(ms, 3) for stage, ms in result.timings_ms.items()},
    )


_COLLECTION_LABEL = re.compile(r'[{,]collection="([^"]*)"')


@service_router.get("/metrics", response_class=PlainTextResponse, responses={200: {"content": {"text/plain": {}}}})
def metrics(request: Request) -> PlainTextResponse:
    """Prometheus metrics: per-stage latency histograms, requests by status, each collection's documents and memory.
    The series labelled with a collection are shown to keys that may use it (all of them to HYBRID_METRICS_KEY, an
    unscoped key, or anyone when the service has no keys); without a key, only the service-wide series."""
    text = generate_latest(request.app.state.metrics.registry).decode()
    keys: Keys = request.app.state.keys
    grant = presented_grant(request)
    if not keys.sees_all_metrics(presented_key(request)) and (grant is None or grant.scope is not None):
        aliases_of = request.app.state.collections.aliases_of if request.app.state.collections is not None else lambda name: []
        lines = []
        for line in text.splitlines():
            found = _COLLECTION_LABEL.search(line) if not line.startswith("#") else None
            if found is None or (grant is not None and grant.allows(found[1], *aliases_of(found[1]))):
                lines.append(line)
        text = "\n".join(lines) + "\n"
    return PlainTextResponse(text, media_type=CONTENT_TYPE_LATEST)


@service_router.get("/health", response_model=Health)
def health() -> Health:
    return Health()


@service_router.get("/ready", response_model=Ready, responses={503: {"model": Ready}})
def ready(request: Request):
    """Ready once every collection is open; describes the default collection when it exists."""
    collections = request.app.state.collections
    if collections is None:
        return JSONResponse(status_code=503, content=Ready(ready=False).model_dump())
    grant = presented_grant(request)
    failed = collections.failed
    failures = {
        "collections": len(collections.served),
        "failed_collections": len(failed),
        "failed": {
            name: why
            for name, (why, _) in sorted(failed.items())
            if grant is not None and grant.allows(name, *collections.aliases_of(name))
        },
    }
    try:
        serving = _serving_of(collections.default())
    except (NotFound, HTTPException):
        return Ready(ready=True, **failures)
    return describe(serving, **failures)


def describe(serving: Serving, **more) -> Ready:
    index = serving.index
    problem = serving.collection.storage_problem() if serving.collection is not None else serving.write_refusal
    return Ready(
        ready=True,
        documents=serving.documents,
        index=str(index.path),
        created_at=index.manifest.created_at,
        model=index.manifest.embedder.model,
        fusion_tuning=asdict(index.manifest.fusion_tuning) if index.manifest.fusion_tuning else None,
        defaults=serving.pipeline.defaults.to_dict(),
        evidence=serving.evidence,
        metadata={name: info.to_dict() for name, info in index.manifest.metadata.items()},
        writable=problem is None,
        write_refusal=problem,
        **more,
    )


@service_router.post(
    "/admin/reload",
    response_model=Ready,
    dependencies=[Depends(require_unscoped_write_key)],
    responses={
        401: {"description": "missing API key"},
        403: {"description": "not a write key, or no write keys configured"},
        409: {"description": "reload failed or already running; the previous index stays in service"},
    },
)
def reload(request: Request) -> Ready:
    """Open every collection's folder again (e.g. after `hybrid index` rebuilt one) and swap each in; serve the
    collections built into the data directory since."""
    collections = collections_of(request)
    try:
        collections.reload()
    except ReloadInProgress as exc:
        raise HTTPException(status_code=409, detail=str(exc)) from None
    except Exception as exc:  # a broken new build must never take down the one being served
        raise HTTPException(status_code=409, detail=f"reload failed, still serving the previous index: {exc}") from None
    return ready(request)
