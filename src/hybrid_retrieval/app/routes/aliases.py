"""Aliases: list them (read key), point one at a collection or drop it (write key), within the key's scope."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Request
from fastapi import Path as PathParam

from hybrid_retrieval.app.json_body import CheckedRoute
from hybrid_retrieval.app.routes.collections import CHANGE_RESPONSES
from hybrid_retrieval.app.routes.shared import CollectionsDep
from hybrid_retrieval.app.schemas.collections import AliasList, AliasSet
from hybrid_retrieval.app.security import READ_KEY, WRITE_KEY, allowed, check_scope
from hybrid_retrieval.common.names import NAME_RULE, NAME_RULE_TEXT

AliasName = Annotated[str, PathParam(description=f"an alias: {NAME_RULE_TEXT}", pattern=f"^{NAME_RULE.pattern}$", examples=["products"])]

reads = APIRouter(route_class=CheckedRoute, dependencies=[READ_KEY], tags=["aliases"])
writes = APIRouter(route_class=CheckedRoute, dependencies=[WRITE_KEY], tags=["aliases"], responses=CHANGE_RESPONSES)


@reads.get("/aliases", response_model=AliasList)
def list_aliases(collections: CollectionsDep, request: Request) -> AliasList:
    """The aliases the key may use (by the alias, or the collection it points to)."""
    return AliasList(aliases={alias: target for alias, target in collections.aliases.items() if allowed(request, alias, target)})


@writes.put("/aliases/{alias}", response_model=AliasList)
def set_alias(alias: AliasName, body: AliasSet, collections: CollectionsDep, request: Request) -> AliasList:
    """Create an alias, or repoint it in one atomic step: requests through it see the old or the new collection."""
    check_scope(request, alias)
    check_scope(request, body.collection)
    collections.set_alias(alias, body.collection)
    return list_aliases(collections, request)


@writes.delete("/aliases/{alias}", response_model=AliasList)
def drop_alias(alias: AliasName, collections: CollectionsDep, request: Request) -> AliasList:
    check_scope(request, alias)
    collections.drop_alias(alias)
    return list_aliases(collections, request)
