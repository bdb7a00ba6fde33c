"""Write endpoints: documents in and out of the live collection (indexer.live), key-protected (write role)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi import Path as PathParam
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.convertors import Convertor, register_url_convertor

from hybrid_retrieval.app.json_body import CheckedRoute, clean, parse_body
from hybrid_retrieval.app.routes import json_response, serving_of
from hybrid_retrieval.app.schemas import DOC_ID_PATTERN, DeleteRequest, DocumentBatch, DocumentOut, Stats, TaskInfo, WriteResult
from hybrid_retrieval.app.security import require_api_key, require_write_key
from hybrid_retrieval.common.errors import DeadlineExceeded, HybridError, SpecError, StorageError
from hybrid_retrieval.engine.serving import Reloader, Serving
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
_WRITE_RESPONSES = {
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


def _collection(serving: Serving):
    if serving.collection is None:
        raise HTTPException(status_code=409, detail=f"this index takes no writes: {serving.write_refusal}")
    return serving.collection


def _write(deadlines, write, items: list) -> int:
    """A write's sequence number, under the write deadline; 409 when the index cannot take it now (another process
    holds its log). A full disk (507) and a read-only folder (503) answer through app.main's handlers."""
    with deadlines.start(deadlines.write_seconds, "HYBRID_WRITE_TIMEOUT") as deadline, budget.within(deadline):
        try:
            return write(items)
        except (SpecError, StorageError, DeadlineExceeded):  # 422, 507/503 and 504 through app.main's handlers
            raise
        except HybridError as exc:
            raise HTTPException(status_code=409, detail=str(exc)) from None


def _written(serving: Serving, seq: int, count: int, wait: bool) -> WriteResult:
    collection = serving.collection
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


def _inline(schema: dict) -> dict:
    """A model's JSON schema with its $defs substituted in place (the body is parsed by hand, so FastAPI does not
    register the models as components)."""
    defs = schema.pop("$defs", {})

    def resolve(node):
        if isinstance(node, dict):
            ref = node.get("$ref")
            return resolve(defs[ref.rsplit("/", 1)[-1]]) if ref else {k: resolve(v) for k, v in node.items()}
        return [resolve(v) for v in node] if isinstance(node, list) else node

    return resolve(schema)


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


def document_routes(collection: Callable, compact_path: str) -> APIRouter:
    """The write and read routes of the collection the dependency `collection` resolves (app.routes); a compaction at
    `compact_path`."""
    router = APIRouter(route_class=CheckedRoute)  # bodies parsed by app.json_body
    named = Depends(collection)  # default values, not annotations: see app.routes.serving_of
    current = Depends(serving_of(collection))
    _add_writes(router, named, current)
    _add_reads(router, current, compact_path)
    return router


def _add_writes(router: APIRouter, named, current) -> None:
    """PUT /documents, DELETE /documents/{id} and POST /documents/delete: `named` resolves the collection, `current`
    what it serves now."""

    @router.put(
        "/documents",
        response_model=WriteResult,
        dependencies=[Depends(require_write_key)],
        responses={**_WRITE_RESPONSES, 202: {"model": TaskInfo, "description": "with ?wait=false: the load, queued as a task"}},
        openapi_extra={
            "requestBody": {
                "required": True,
                "description": f"JSON, or {NDJSON}: one document object per line",
                "content": {"application/json": {"schema": _inline(DocumentBatch.model_json_schema())}},
            }
        },
    )
    async def put_documents(request: Request, wait: Wait = None, reloader: Reloader = named, serving: Serving = current) -> Response:
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
        return json_response(await run_in_threadpool(_written, serving, seq, len(documents), bool(wait)))

    @router.delete(
        "/documents/{doc_id:document_id}", response_model=WriteResult, dependencies=[Depends(require_write_key)], responses=_WRITE_RESPONSES
    )
    def delete_document(doc_id: DocId, request: Request, wait: Wait = None, serving: Serving = current) -> WriteResult:
        seq = _write(request.app.state.deadlines, _collection(serving).delete, [clean(doc_id, ("path", "doc_id"))])
        return _written(serving, seq, 1, bool(wait))

    @router.post("/documents/delete", response_model=WriteResult, dependencies=[Depends(require_write_key)], responses=_WRITE_RESPONSES)
    def delete_documents(body: DeleteRequest, request: Request, wait: Wait = None, serving: Serving = current) -> WriteResult:
        seq = _write(request.app.state.deadlines, _collection(serving).delete, body.ids)
        return _written(serving, seq, len(body.ids), bool(wait))


def _add_reads(router: APIRouter, current, compact_path: str) -> None:
    """GET /documents/{id}, GET /stats and the compaction at `compact_path`."""

    @router.get(
        "/documents/{doc_id:document_id}",
        response_model=DocumentOut,
        dependencies=[Depends(require_api_key)],
        responses={404: {"description": "no such document"}},
    )
    def get_document(doc_id: DocId, serving: Serving = current) -> DocumentOut:
        """The latest acknowledged version of a document (before it is searchable, too)."""
        doc_id = clean(doc_id, ("path", "doc_id"))  # ids are stored NFC-normalised
        if serving.collection is not None:
            doc = serving.collection.get(doc_id)
        else:
            doc = serving.index.document_by_id(doc_id)
        if doc is None:
            raise HTTPException(status_code=404, detail=f"no document with id {doc_id!r}")
        return DocumentOut(id=doc["id"], title=doc["title"], text=doc["text"], metadata=doc.get("metadata", {}))

    @router.get("/stats", response_model=Stats, dependencies=[Depends(require_api_key)], responses={401: {}, 403: {}})
    def stats(serving: Serving = current) -> Stats:
        """Live counts, sequence numbers and segment sizes."""
        return stats_of(serving)

    @router.post(compact_path, response_model=Stats, dependencies=[Depends(require_write_key)], responses=_WRITE_RESPONSES)
    def compact(serving: Serving = current) -> Stats:
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
