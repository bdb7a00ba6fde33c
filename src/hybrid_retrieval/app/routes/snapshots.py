"""Snapshots over HTTP: take one while the collection serves, list, download, delete, restore from a listed one or an
uploaded file. Reads for a read key, the rest for a write key. A snapshot's routes name the collection it was taken of
(an alias: the collection it points to), which may have been dropped since. The work is engine.collections' and
indexer.datadir.snapshots'."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi import Path as PathParam
from fastapi.responses import FileResponse, Response
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from hybrid_retrieval.app.json_body import CheckedRoute
from hybrid_retrieval.app.routes.collections import collection_info
from hybrid_retrieval.app.routes.shared import CollectionsDep, Name, scoped
from hybrid_retrieval.app.schemas.collections import CollectionInfo
from hybrid_retrieval.app.schemas.snapshots import SnapshotList, SnapshotOut, SnapshotRestore
from hybrid_retrieval.app.security import READ_KEY, WRITE_KEY, allowed, check_scope
from hybrid_retrieval.common.errors import SnapshotNotFound, SpecError
from hybrid_retrieval.common.names import NAME_RULE, NAME_RULE_TEXT
from hybrid_retrieval.engine.collections import Collections

_EXAMPLE_ID = "products-20261125T101500123456Z"
NewName = Annotated[
    str, PathParam(description=f"the collection to restore into: {NAME_RULE_TEXT}", pattern=f"^{NAME_RULE.pattern}$", examples=["products"])
]
SnapshotId = Annotated[str, PathParam(description="a snapshot's id", examples=[_EXAMPLE_ID])]
TAR = "application/x-tar"
_UPLOAD_TYPES = (TAR, "application/octet-stream")
_CHANGE: dict[int | str, dict[str, Any]] = {
    401: {"description": "missing key"},
    403: {"description": "not a write key, or not one for this collection"},
    404: {"description": "no such collection or snapshot"},
    409: {"description": "the collection exists (restore with replace=true), is sharded, or no snapshot folder is configured"},
    413: {"description": "the upload is larger than HYBRID_MAX_SNAPSHOT_BYTES"},
    415: {"description": "the body is neither JSON naming a snapshot nor a snapshot file"},
    422: {"description": "the snapshot file is truncated, damaged or not a snapshot: nothing was changed"},
}

reads = APIRouter(route_class=CheckedRoute, dependencies=[READ_KEY], tags=["snapshots"])
writes = APIRouter(route_class=CheckedRoute, dependencies=[WRITE_KEY], tags=["snapshots"], responses=_CHANGE)


@writes.post("/collections/{name}/snapshots", status_code=201, response_model=SnapshotOut)
def create_snapshot(
    name: Name,
    collections: CollectionsDep,
    request: Request,
    model: Annotated[
        Literal["reference", "include"],
        Query(
            description="reference: the model's files by sha256 (a few bytes; the restoring side must have that model: a "
            "collection of it, or its export); include: copy them in (restores anywhere)"
        ),
    ] = "reference",
) -> SnapshotOut:
    """Take a consistent snapshot: exactly the writes acknowledged before it, none after. Searches and writes go on
    while it is written (into HYBRID_SNAPSHOTS); HYBRID_SNAPSHOT_KEEP says how many of a collection's are kept."""
    reloader = scoped(request, name, lambda: collections.resolve(name))
    return SnapshotOut(**collections.snapshot(reloader.name, model).to_dict())


@reads.get("/collections/{name}/snapshots", response_model=SnapshotList, responses=_CHANGE)
def list_snapshots(name: Name, collections: CollectionsDep, request: Request) -> SnapshotList:
    """The complete snapshots of a collection (served or dropped since), oldest first."""
    target = _target(request, collections, name)
    return SnapshotList(snapshots=[SnapshotOut(**info.to_dict()) for info in collections.snapshots.infos(target)])


@reads.get("/snapshots", response_model=SnapshotList)
def list_all_snapshots(collections: CollectionsDep, request: Request) -> SnapshotList:
    """Every complete snapshot the key may use, oldest first."""
    infos = collections.snapshots.infos()
    return SnapshotList(
        snapshots=[
            SnapshotOut(**info.to_dict()) for info in infos if allowed(request, info.collection, *collections.aliases_of(info.collection))
        ]
    )


@reads.get(
    "/collections/{name}/snapshots/{snapshot_id}",
    responses={**_CHANGE, 200: {"content": {TAR: {}}, "description": "the snapshot file"}},
    response_class=FileResponse,
)
def download_snapshot(name: Name, snapshot_id: SnapshotId, collections: CollectionsDep, request: Request) -> FileResponse:
    """The snapshot file, for copying elsewhere (restore it with POST .../snapshots/restore or `hybrid snapshot restore`)."""
    found = _snapshot_of(collections, _target(request, collections, name), snapshot_id)
    path = collections.snapshots.path(found)
    return FileResponse(path, media_type=TAR, filename=path.name)


@writes.delete("/collections/{name}/snapshots/{snapshot_id}", status_code=204)
def delete_snapshot(name: Name, snapshot_id: SnapshotId, collections: CollectionsDep, request: Request) -> Response:
    found = _snapshot_of(collections, _target(request, collections, name), snapshot_id)
    collections.snapshots.delete(found)
    collections.resources.metrics.describe_snapshots(collections.snapshots.infos())
    return Response(status_code=204)


@writes.post(
    "/collections/{name}/snapshots/restore",
    status_code=201,
    response_model=CollectionInfo,
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {
                    "schema": SnapshotRestore.model_json_schema(),
                    "example": {"snapshot": "products-20261125T101500123456Z"},
                },
                TAR: {"schema": {"type": "string", "format": "binary"}, "example": "(a file from GET .../snapshots/{id})"},
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}, "example": "(a snapshot file)"},
            },
        }
    },
)
async def restore_snapshot(
    name: NewName,
    collections: CollectionsDep,
    request: Request,
    replace: Annotated[bool, Query(description="replace the collection of that name in one atomic swap (else 409 if it exists)")] = False,
) -> CollectionInfo:
    """Restore a snapshot as collection `name`: from a listed one (JSON `{"snapshot": id}`) or an uploaded file
    (`application/x-tar` or `application/octet-stream` body, streamed to disk, at most HYBRID_MAX_SNAPSHOT_BYTES). The
    file is checked whole (every byte's checksum) before anything changes; a new collection, or the old one replaced
    at once: searches see the old or the restored collection, never a mix."""
    check_scope(request, name)
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    store = collections.snapshots  # 409 first when no snapshot folder is configured
    if content_type == "application/json":
        listed = await _listed(request, collections)
        reloader = await run_in_threadpool(collections.restore, name, listed, replace)
    elif content_type in _UPLOAD_TYPES:
        with store.partial(f"upload-{uuid.uuid4().hex}") as upload:
            with upload.open("wb") as out:
                async for chunk in request.stream():  # the body limit middleware answers 413 past the limit
                    out.write(chunk)
            reloader = await run_in_threadpool(collections.restore, name, upload, replace)
    else:
        raise HTTPException(415, f"send JSON naming a listed snapshot, or the snapshot file as {' or '.join(_UPLOAD_TYPES)}")
    return collection_info(collections, reloader)


async def _listed(request: Request, collections: Collections) -> Path:
    """The file of the listed snapshot a JSON body names, if the key may use the collection it was taken of."""
    try:
        body = SnapshotRestore.model_validate(await request.json())
    except ValidationError as exc:
        error = exc.errors()[0]
        raise SpecError(".".join(str(part) for part in error["loc"]) or "snapshot", error["msg"]) from None
    except ValueError:
        raise SpecError("body", "not valid JSON") from None
    info = collections.snapshots.get(body.snapshot)
    check_scope(request, info.collection, *collections.aliases_of(info.collection))
    return collections.snapshots.path(info.id)


def _target(request: Request, collections: Collections, name: str) -> str:
    """The collection `name` names (an alias: the one it points to), if the key may use it."""
    target = collections.aliases.get(name, name)
    check_scope(request, name, target)
    return target


def _snapshot_of(collections: Collections, target: str, snapshot_id: str) -> str:
    """The id of a snapshot of collection `target`."""
    info = collections.snapshots.get(snapshot_id)
    if info.collection != target:
        raise SnapshotNotFound(f"no snapshot {snapshot_id!r} of collection {target!r}")
    return info.id
