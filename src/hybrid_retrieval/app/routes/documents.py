"""The documents of a collection (indexer.live through the engine): writes (PUT /documents, DELETE /documents/{id},
POST /documents/delete) for a write key, reads (GET /documents/{id}, GET /stats) for a read key, and the compaction
(write key). Mounted for the default collection and under /collections/{name}."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi import Path as PathParam
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.convertors import Convertor, register_url_convertor

from hybrid_retrieval.app.budget import Deadlines
from hybrid_retrieval.app.json_body import CheckedRoute, clean, parse_body
from hybrid_retrieval.app.routes.shared import Collection, CurrentServing, json_response
from hybrid_retrieval.app.schemas.documents import DOC_ID_PATTERN, DeleteRequest, DocumentBatch, DocumentOut, Stats, TaskInfo, WriteResult
from hybrid_retrieval.app.security import READ_KEY, WRITE_KEY
from hybrid_retrieval.common.errors import DeadlineExceeded, HybridError, SpecError, StorageError
from hybrid_retrieval.engine.serving import Serving
from hybrid_retrieval.engine.writable import WritableCollection
from hybrid_retrieval.search import budget

WAIT_SECONDS = 30.0
Wait = Annotated[
    bool | None,
    Query(
        description="true: answer only once the write is searchable (a refresh is published at once); absent: once it "
        "is durable (searchable within HYBRID_REFRESH_INTERVAL, 1 s); false (PUT only): at once, 202 with a task that "
        "loads the documents in batches of HYBRID_MAX_BATCH_DOCS (GET /tasks/{id})"
    ),
]
WRITE_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"description": "missing key"},
    403: {"description": "not a write key, or writes disabled"},
    409: {"description": "this index cannot take writes, or not now (the message says why)"},
    413: {"description": "body too large"},
    422: {"description": "invalid batch; `loc` names the item and field"},
    503: {"description": "the index folder cannot be written (read-only): nothing was written"},
    504: {"description": "the write ran past HYBRID_WRITE_TIMEOUT before it was logged: nothing was written"},
    507: {"description": "the disk is full: nothing was written"},
}
NDJSON = "application/x-ndjson"

writes = APIRouter(route_class=CheckedRoute, dependencies=[WRITE_KEY], responses=WRITE_RESPONSES)  # bodies parsed by app.json_body
reads = APIRouter(route_class=CheckedRoute, dependencies=[READ_KEY])


class DocumentIdConvertor(Convertor[str]):
    """Any character of an id, "/" (sent percent-encoded, a%2Fb, decoded before routing) and line breaks included:
    Starlette's `path` stops at a newline, which left such ids unreachable by these routes."""

    regex = r"[\s\S]+"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("document_id", DocumentIdConvertor())
DocId = Annotated[
    str, PathParam(description="a document id, percent-encoded; not blank", pattern=DOC_ID_PATTERN, examples=["doc-1", "a%2Fb"])
]


def _inline(schema: dict[str, Any]) -> dict[str, Any]:
    """A model's JSON schema with its $defs substituted in place (the body is parsed by hand, so FastAPI does not
    register the models as components)."""
    defs = schema.pop("$defs", {})

    def resolve(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            return resolve(defs[ref.rsplit("/", 1)[-1]]) if ref else {k: resolve(v) for k, v in node.items()}
        return [resolve(v) for v in node] if isinstance(node, list) else node

    resolved: dict[str, Any] = resolve(schema)
    return resolved


@writes.put(
    "/documents",
    response_model=WriteResult,
    responses={202: {"model": TaskInfo, "description": "with ?wait=false: the load, queued as a task"}},
    openapi_extra={
        "requestBody": {
            "required": True,
            "description": f"JSON, or {NDJSON}: one document object per line",
            "content": {"application/json": {"schema": _inline(DocumentBatch.model_json_schema())}},
        }
    },
)
async def put_documents(request: Request, reloader: Collection, serving: CurrentServing, wait: Wait = None) -> Response:
    """Upsert documents by id, all or nothing: every document is checked, embedded and logged durably before the
    answer (its sequence number). With ?wait=false, any number of documents (up to the body limit) are checked,
    then loaded by a task in batches: 202 with the task (GET /tasks/{id})."""
    documents = await _documents(request)
    collection = _collection(serving)
    if wait is False:
        task = await run_in_threadpool(request.app.state.tasks.submit, reloader, documents)
        return JSONResponse(status_code=202, content=task.to_dict(), headers={"Location": f"/tasks/{task.id}"})
    # embedding and fsync: off the event loop
    seq = await run_in_threadpool(_write, request.app.state.deadlines, collection.upsert, documents)
    return json_response(await run_in_threadpool(_written, collection, seq, len(documents), bool(wait)))


@writes.delete("/documents/{doc_id:document_id}", response_model=WriteResult)
def delete_document(doc_id: DocId, request: Request, serving: CurrentServing, wait: Wait = None) -> WriteResult:
    collection = _collection(serving)
    seq = _write(request.app.state.deadlines, collection.delete, [clean(doc_id, ("path", "doc_id"))])
    return _written(collection, seq, 1, bool(wait))


@writes.post("/documents/delete", response_model=WriteResult)
def delete_documents(body: DeleteRequest, request: Request, serving: CurrentServing, wait: Wait = None) -> WriteResult:
    collection = _collection(serving)
    seq = _write(request.app.state.deadlines, collection.delete, body.ids)
    return _written(collection, seq, len(body.ids), bool(wait))


@reads.get("/documents/{doc_id:document_id}", response_model=DocumentOut, responses={404: {"description": "no such document"}})
def get_document(doc_id: DocId, serving: CurrentServing) -> DocumentOut:
    """The latest acknowledged version of a document (before it is searchable, too)."""
    doc_id = clean(doc_id, ("path", "doc_id"))  # ids are stored NFC-normalised
    doc = serving.collection.get(doc_id) if serving.collection is not None else serving.index.document_by_id(doc_id)
    if doc is None:
        raise HTTPException(status_code=404, detail=f"no document with id {doc_id!r}")
    return DocumentOut(id=doc["id"], title=doc["title"], text=doc["text"], metadata=doc.get("metadata", {}))


@reads.get("/stats", response_model=Stats, responses={401: {}, 403: {}})
def stats(serving: CurrentServing) -> Stats:
    """Live counts, sequence numbers and segment sizes."""
    return stats_of(serving)


def compact(serving: CurrentServing) -> Stats:
    """Merge the live segment and deletions into a new base segment now (published atomically; searches and writes
    continue meanwhile). Also runs in the background past HYBRID_COMPACT_FRACTION."""
    collection = _collection(serving)
    try:
        collection.compact()
    except OSError as exc:
        raise StorageError.of(exc, "the compaction failed and the previous base stays in service") from None
    except HybridError as exc:  # dropped or restored over meanwhile
        raise HTTPException(status_code=409, detail=str(exc)) from None
    return stats_of(serving)


# One compaction at two paths: /admin/compact for the default collection, /compact under /collections/{name}
default_compaction = APIRouter(route_class=CheckedRoute, dependencies=[WRITE_KEY], responses=WRITE_RESPONSES)
default_compaction.add_api_route("/admin/compact", compact, methods=["POST"], response_model=Stats)
named_compaction = APIRouter(route_class=CheckedRoute, dependencies=[WRITE_KEY], responses=WRITE_RESPONSES)
named_compaction.add_api_route("/compact", compact, methods=["POST"], response_model=Stats)


def stats_of(serving: Serving) -> Stats:
    temporary = serving.temporary_bytes
    if serving.collection is None:
        return Stats(
            documents=serving.documents,
            base_documents=serving.index.num_docs,
            writable=False,
            write_refusal=serving.write_refusal,
            temporary_bytes=temporary,
        )
    problem = serving.collection.storage_problem()
    return Stats(**serving.collection.stats(), writable=problem is None, write_refusal=problem, temporary_bytes=temporary)


def _collection(serving: Serving) -> WritableCollection:
    if serving.collection is None:
        raise HTTPException(status_code=409, detail=f"this index takes no writes: {serving.write_refusal}")
    return serving.collection


def _write(deadlines: Deadlines, write: Callable[[list[Any]], int], items: list[Any]) -> int:
    """A write's sequence number, under the write deadline; 409 when the index cannot take it now (another process
    holds its log). A full disk (507) and a read-only folder (503) answer through app.errors."""
    with deadlines.start(deadlines.write_seconds, "HYBRID_WRITE_TIMEOUT") as deadline, budget.within(deadline):
        try:
            return write(items)
        except (SpecError, StorageError, DeadlineExceeded):  # 422, 507/503 and 504 through app.errors
            raise
        except HybridError as exc:
            raise HTTPException(status_code=409, detail=str(exc)) from None


def _written(collection: WritableCollection, seq: int, count: int, wait: bool) -> WriteResult:
    if wait:
        collection.refresh()
        collection.wait_visible(seq, WAIT_SECONDS)
    return WriteResult(sequence=seq, documents=count, visible=collection.view.seq >= seq)


async def _documents(request: Request) -> list[Any]:
    """The batch from a JSON body {"documents": [...]} or an NDJSON body (one document per line)."""
    ndjson = request.headers.get("content-type", "").split(";")[0].strip() == NDJSON
    parsed = await run_in_threadpool(parse_body, await request.body(), ndjson)  # up to 16 MiB: off the event loop
    if ndjson:
        return parsed
    if not isinstance(parsed, dict) or set(parsed) != {"documents"}:
        raise SpecError("documents", 'the body is {"documents": [...]} (or application/x-ndjson, one document per line)')
    return parsed["documents"]  # the collection checks every document, naming its position
