"""POST /search and /search/batch: thin translation between JSON and the search pipeline. A read key's routes, under
the in-flight limit; mounted for the default collection and under /collections/{name}."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from hybrid_retrieval.app.json_body import CheckedRoute
from hybrid_retrieval.app.routes.shared import CurrentServing, in_flight, json_response
from hybrid_retrieval.app.schemas.search import BatchRequest, BatchResponse, SearchRequest, SearchResponse
from hybrid_retrieval.app.security import READ_KEY
from hybrid_retrieval.common.errors import SpecError
from hybrid_retrieval.engine.serving import Serving
from hybrid_retrieval.search import budget
from hybrid_retrieval.search.curation import Curation, for_query
from hybrid_retrieval.search.grouping import GroupBy
from hybrid_retrieval.search.pipeline import Query, SearchResult
from hybrid_retrieval.search.vectors import check_vector

router = APIRouter(
    route_class=CheckedRoute,  # bodies parsed by app.json_body
    dependencies=[READ_KEY, Depends(in_flight)],
    responses={
        401: {"description": "missing API key"},
        403: {"description": "invalid API key"},
        404: {"description": "no such collection"},
        413: {"description": "body too large"},
        422: {"description": "invalid request; `loc` names the field"},
        503: {"description": "busy or not ready; see Retry-After"},
    },
)


@router.post("/search", response_model=SearchResponse)
async def search(body: SearchRequest, request: Request, serving: CurrentServing) -> Response:
    def run() -> Response:
        shown = _presentation(serving, body)
        vector = query_vector(serving, body)
        group_by, curation = _group_by(serving, body), _curation(serving, body)
        result = serving.pipeline.search(
            body.query, k=body.k, spec=body.spec(), offset=body.offset, vector=vector, group_by=group_by, curation=curation
        )
        request.app.state.metrics.observe_search(result.timings_ms)
        return json_response(_response(serving, body, result, shown))

    return await off_loop(request, run)


@router.post("/search/batch", response_model=BatchResponse)
async def search_batch(body: BatchRequest, request: Request, serving: CurrentServing) -> Response:
    """Up to 64 searches in one call, their queries embedded in one model run; all checked before any runs."""

    def run() -> Response:
        started = time.perf_counter()
        shown, queries = [], []
        for i, item in enumerate(body.searches):
            try:
                shown.append(_presentation(serving, item))
                vector, group_by = query_vector(serving, item), _group_by(serving, item)
                queries.append(Query(item.query, item.k, item.spec(), item.offset, vector, group_by, _curation(serving, item)))
            except SpecError as exc:
                raise exc.within(f"searches[{i}]") from None
        results = serving.pipeline.search_many(queries)
        responses = []
        for item, result, presentation in zip(body.searches, results, shown):
            request.app.state.metrics.observe_search(result.timings_ms)
            responses.append(_response(serving, item, result, presentation))
        return json_response(BatchResponse(results=responses, timings_ms={"total": round((time.perf_counter() - started) * 1000, 3)}))

    return await off_loop(request, run)


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


def query_vector(serving: Serving, body: SearchRequest) -> np.ndarray | None:
    """The request's own query vector, checked against the collection's dimension (422 naming `vector`)."""
    return check_vector(body.vector, serving.pipeline.dense.dimension, "vector") if body.vector is not None else None


def _group_by(serving: Serving, body: SearchRequest) -> GroupBy | None:
    return serving.pipeline.check_group_by(body.group_by.model_dump() if body.group_by is not None else None)


def _curation(serving: Serving, body: SearchRequest) -> Curation:
    """The request's pins and hidden documents, then those of the collection's rules for its query."""
    return body.curation().then(for_query(serving.curation_rules, body.query))


@dataclass(frozen=True)
class Presentation:
    """What a request asks to see of its hits, checked against the served index (422 naming the field)."""

    fields: list[str] | str | None
    facets: list[str] | None
    passages: int


def _presentation(serving: Serving, body: SearchRequest) -> Presentation:
    presenter = serving.presenter
    return Presentation(presenter.check_fields(body.fields), presenter.check_facets(body.facets), presenter.check_passages(body.passages))


def _response(serving: Serving, body: SearchRequest, result: SearchResult, shown: Presentation) -> SearchResponse:
    presenter, reranker = serving.presenter, serving.pipeline.reranker
    wanted = body.query and (body.explain or result.spec.highlight.enabled)  # the typos' variants are shown or marked
    typos = serving.pipeline.typo_variants(body.query, result.spec) if wanted else {}
    hits = presenter.hits(
        result,
        body.query or "",
        include_text=body.include_text,
        explain=body.explain,
        fields=shown.fields,
        passages=shown.passages,
        variants=[variant["term"] for found in typos.values() for variant in found],
    )
    # the presenter's hits and facets are plain dicts of the response's shape: validated into it here
    fields: dict[str, Any] = {
        "query": body.query,
        "k": body.k,
        "offset": result.offset,
        "has_more": result.has_more,
        "spec": result.spec.to_dict(),
        "hits": hits,
        "facets": presenter.facets(result, shown.facets),
        "typos": typos if body.explain and body.query else None,
        "reranker": reranker.name if result.reranked and reranker is not None else None,
        "timings_ms": {stage: round(ms, 3) for stage, ms in result.timings_ms.items()},
    }
    return SearchResponse.model_validate(fields)
