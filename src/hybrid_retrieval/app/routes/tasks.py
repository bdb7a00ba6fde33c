"""Bulk-load tasks (PUT .../documents?wait=false): their state, for a read key that may use their collection."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from hybrid_retrieval.app.json_body import CheckedRoute
from hybrid_retrieval.app.routes.collections import READ_RESPONSES
from hybrid_retrieval.app.routes.shared import CollectionsDep
from hybrid_retrieval.app.schemas.documents import TaskInfo, TaskList
from hybrid_retrieval.app.security import READ_KEY, allowed, check_scope

router = APIRouter(route_class=CheckedRoute, dependencies=[READ_KEY], tags=["tasks"])


@router.get("/tasks/{task_id}", response_model=TaskInfo, responses=READ_RESPONSES)
def get_task(task_id: str, collections: CollectionsDep, request: Request) -> JSONResponse:
    """A bulk load's state, documents done (durable) of the total, rate and error."""
    task = request.app.state.tasks.get(task_id)
    check_scope(request, task.collection, *collections.aliases_of(task.collection))
    return JSONResponse(task.to_dict())


@router.get("/tasks", response_model=TaskList)
def list_tasks(collections: CollectionsDep, request: Request, collection: str | None = None) -> JSONResponse:
    """Recent bulk loads, oldest first (of one collection with ?collection=)."""
    tasks = [
        task.to_dict()
        for task in request.app.state.tasks.list(collection)
        if allowed(request, task.collection, *collections.aliases_of(task.collection))
    ]
    return JSONResponse({"tasks": tasks})
