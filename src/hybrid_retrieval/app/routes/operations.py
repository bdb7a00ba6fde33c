"""Operating the service: GET /health, /ready and /metrics, open to anyone (a key shows more of /ready and /metrics),
and POST /admin/reload for a write key of every collection."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import asdict
from typing import TypedDict

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from hybrid_retrieval.app.json_body import CheckedRoute
from hybrid_retrieval.app.routes.shared import collections_of, serving_of
from hybrid_retrieval.app.schemas.operations import Health, Ready
from hybrid_retrieval.app.security import ADMIN_KEY, Keys, presented_grant, presented_key
from hybrid_retrieval.common.errors import NotFound
from hybrid_retrieval.engine.collections import Collections
from hybrid_retrieval.engine.serving import ReloadInProgress, Serving

router = APIRouter(route_class=CheckedRoute)
admin = APIRouter(route_class=CheckedRoute, dependencies=[ADMIN_KEY])

_COLLECTION_LABEL = re.compile(r'[{,]collection="([^"]*)"')


@router.get("/metrics", response_class=PlainTextResponse, responses={200: {"content": {"text/plain": {}}}})
def metrics(request: Request) -> PlainTextResponse:
    """Prometheus metrics: per-stage latency histograms, requests by status, each collection's documents and memory.
    The series labelled with a collection are shown to keys that may use it (all of them to HYBRID_METRICS_KEY, an
    unscoped key, or anyone when the service has no keys); without a key, only the service-wide series."""
    text = generate_latest(request.app.state.metrics.registry).decode()
    keys: Keys = request.app.state.keys
    grant = presented_grant(request)
    if not keys.sees_all_metrics(presented_key(request)) and (grant is None or grant.scope is not None):
        collections: Collections | None = request.app.state.collections
        aliases_of: Callable[[str], list[str]] = collections.aliases_of if collections is not None else lambda name: []
        lines = []
        for line in text.splitlines():
            found = _COLLECTION_LABEL.search(line) if not line.startswith("#") else None
            if found is None or (grant is not None and grant.allows(found[1], *aliases_of(found[1]))):
                lines.append(line)
        text = "\n".join(lines) + "\n"
    return PlainTextResponse(text, media_type=CONTENT_TYPE_LATEST)


@router.get("/health", response_model=Health)
def health() -> Health:
    return Health()


class _Counts(TypedDict):
    """What /ready says of every collection, beside the default one's description."""

    collections: int
    failed_collections: int
    failed: dict[str, str]


@router.get("/ready", response_model=Ready, responses={503: {"model": Ready}})
def ready(request: Request) -> Ready | JSONResponse:
    """Ready once every collection is open; describes the default collection when it exists."""
    collections: Collections | None = request.app.state.collections
    if collections is None:
        return JSONResponse(status_code=503, content=Ready(ready=False).model_dump())
    grant = presented_grant(request)
    failed = collections.failed
    counts = _Counts(
        collections=len(collections.served),
        failed_collections=len(failed),
        failed={
            name: why
            for name, (why, _) in sorted(failed.items())
            if grant is not None and grant.allows(name, *collections.aliases_of(name))
        },
    )
    try:
        serving = serving_of(collections.default())
    except (NotFound, HTTPException):
        return Ready(ready=True, **counts)
    return describe(serving, counts)


def describe(serving: Serving, counts: _Counts) -> Ready:
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
        **counts,
    )


@admin.post(
    "/admin/reload",
    response_model=Ready,
    responses={
        401: {"description": "missing API key"},
        403: {"description": "not a write key, or no write keys configured"},
        409: {"description": "reload failed or already running; the previous index stays in service"},
    },
)
def reload(request: Request) -> Ready | JSONResponse:
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
