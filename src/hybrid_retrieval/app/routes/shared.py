"""What the routers share: the collection a route acts on, the in-flight limit, and JSON answers.

The search and document routers serve twice: the default collection's, unprefixed, and any collection's under
/collections/{name} (app.main mounts them). `named_collection` is the prefix's dependency; `collection` resolves
the collection once the router's key check has passed, which knows what the key may see.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Annotated

from fastapi import Depends, HTTPException, Request
from fastapi import Path as PathParam
from fastapi.responses import Response
from pydantic import BaseModel

from hybrid_retrieval.app.security import allowed, check_scope
from hybrid_retrieval.common.errors import NotFound
from hybrid_retrieval.engine.collections import Collections
from hybrid_retrieval.engine.serving import Reloader, Serving


def collections_of(request: Request) -> Collections:
    collections: Collections | None = request.app.state.collections
    if collections is None:
        raise HTTPException(status_code=503, detail="the service is starting", headers={"Retry-After": "1"})
    return collections


CollectionsDep = Annotated[Collections, Depends(collections_of)]
Name = Annotated[str, PathParam(description="a collection", examples=["products-v1"])]


def serving_of(reloader: Reloader) -> Serving:
    serving = reloader.serving  # read once: the whole request uses one index
    if serving is None:
        raise HTTPException(status_code=503, detail=f"collection {reloader.name!r} is not loaded", headers={"Retry-After": "1"})
    return serving


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


async def named_collection(
    request: Request, name: Annotated[str, PathParam(description="a collection, or an alias of one", examples=["products"])]
) -> None:
    """Under /collections/{name}: the routes act on `name`. Only noted here: a prefix's dependencies run before the
    router's key check, and `collection` must run after it."""
    request.state.collection_name = name


async def collection(request: Request) -> Reloader:
    """The collection the route acts on: `name`'s under /collections/{name}, else the default one
    (HYBRID_DEFAULT_COLLECTION)."""
    collections = collections_of(request)
    name: str | None = getattr(request.state, "collection_name", None)
    if name is None:
        return scoped(request, collections.default_name, collections.default)
    return scoped(request, name, lambda: collections.resolve(name))


Collection = Annotated[Reloader, Depends(collection)]


async def current_serving(reloader: Collection) -> Serving:
    """What the route's collection serves now, read once per request."""
    return serving_of(reloader)


CurrentServing = Annotated[Serving, Depends(current_serving)]


async def in_flight(request: Request) -> AsyncIterator[None]:
    with request.app.state.in_flight.slot():
        yield


def json_response(model: BaseModel) -> Response:
    """The response model as JSON, serialised once by pydantic (returning the model would validate it a second time)."""
    return Response(model.model_dump_json(), media_type="application/json")
