"""Every operation of the HTTP API as a `Call`: the request to send, whether it may be sent again, and how to read
its answer. `Client` and `AsyncClient` send the same calls, one blocking and one awaiting, under one retry policy.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence, Sized
from dataclasses import dataclass, field
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel, TypeAdapter
from pydantic import ValidationError as PydanticValidationError

from hybrid_retrieval.client.errors import ClientError, Unavailable, ValidationError, error_for
from hybrid_retrieval.client.models import (
    BatchResponse,
    CollectionInfo,
    CollectionSettings,
    CollectionSummary,
    CurationRule,
    Defaults,
    Document,
    Ready,
    SearchRequest,
    SearchResponse,
    Snapshot,
    Stats,
    StoredDocument,
    SynonymRule,
    Task,
    WriteResult,
)

T = TypeVar("T")
NDJSON = "application/x-ndjson"
MAX_REQUEST_BYTES = 8 * 1024 * 1024  # a bulk load's request body: half the server's default write limit (16 MiB)
MAX_BATCH_SEARCHES = 64


@dataclass(frozen=True)
class Call(Generic[T]):
    method: str
    path: str
    read: Callable[[httpx.Response], T]
    params: dict[str, Any] | None = None
    json: Any = None
    content: bytes | None = None
    headers: dict[str, str] | None = None
    idempotent: bool = True  # sending it twice does what sending it once does: it may be retried
    # a DELETE's result when it is answered 404 on a try after one that may have been carried out (see may_have_acted):
    # that earlier try deleted it
    gone: Callable[[], T] | None = None

    def request(self, http: httpx.Client | httpx.AsyncClient, headers: dict[str, str]) -> httpx.Request:
        """The request `http` sends: the client's `headers` under the call's own."""
        merged = {**headers, **(self.headers or {})}
        return http.build_request(self.method, self.path, params=self.params, json=self.json, content=self.content, headers=merged)

    def result(self, response: httpx.Response) -> T:
        check(response)
        return self.read(response)


def check(response: httpx.Response) -> None:
    """The typed error of an answer that is not a success (its body read)."""
    if not response.is_success:
        raise error_for(response.status_code, _detail(response), retry_after(response))


def _detail(response: httpx.Response) -> Any:
    try:
        return response.json().get("detail", response.text)
    except (ValueError, AttributeError):
        return response.text


def retry_after(response: httpx.Response) -> float | None:
    """The seconds a Retry-After header asks for (a number or an HTTP date), or None."""
    value = response.headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, (parsedate_to_datetime(value) - datetime.now(timezone.utc)).total_seconds())
    except (TypeError, ValueError):
        return None


@dataclass(frozen=True)
class Retry:
    """When a call is sent again: an idempotent call that met a connection error or a 429, 502 or 503 answer, up to
    `attempts` tries in all, waiting what Retry-After says, else `backoff` seconds doubling each time (with jitter),
    never more than `max_wait`. Calls that are not idempotent (creating a collection, a snapshot, a restore) are sent
    once."""

    attempts: int = 4
    backoff: float = 0.5
    max_wait: float = 30.0
    statuses: tuple[int, ...] = (429, 502, 503)

    def wait(self, call: Call, attempt: int, response: httpx.Response | None) -> float | None:
        """Seconds to wait before sending `call` again after try number `attempt` (from 0) got `response` (None: a
        connection error); None: do not send it again."""
        if not call.idempotent or attempt + 1 >= self.attempts:
            return None
        if response is not None:
            if response.status_code not in self.statuses:
                return None
            asked = retry_after(response)
            if asked is not None:
                return min(asked, self.max_wait)
        return min(self.max_wait, self.backoff * 2**attempt * random.uniform(0.75, 1.25))


NO_RETRY = Retry(attempts=1)


def may_have_acted(outcome: httpx.Response | httpx.TransportError) -> bool:
    """Whether a try that is sent again may have been carried out all the same: the request went out and no answer
    came back, or a proxy in between answered 502."""
    if isinstance(outcome, httpx.TransportError):
        return not isinstance(outcome, (httpx.ConnectError, httpx.ConnectTimeout))
    return outcome.status_code == 502


def settle(
    call: Call[T], retry: Retry, attempt: int, outcome: httpx.Response | httpx.TransportError, unsure: bool = False
) -> tuple[bool, Any]:
    """What try number `attempt` of `call` came to: (True, its result), or (False, seconds to wait before the next
    try). `unsure`: an earlier try may have been carried out. Raises the answer's typed error, or Unavailable when
    the server could not be reached and no try is left."""
    response = outcome if isinstance(outcome, httpx.Response) else None
    if unsure and call.gone is not None and response is not None and response.status_code == 404:
        return True, call.gone()
    wait = retry.wait(call, attempt, response)
    if wait is not None:
        return False, wait
    if isinstance(outcome, httpx.TransportError):
        raise Unavailable(f"{call.method} {call.path}: no answer from the server ({type(outcome).__name__}: {outcome})") from outcome
    return True, call.result(outcome)


Plan = Generator["Call[Any] | float", Any, T]  # yields calls to send (or seconds to pause), gets their results, returns T


def model(cls: type[BaseModel]) -> Callable[[httpx.Response], Any]:
    return lambda response: cls.model_validate(response.json())


def listed(cls: type[BaseModel], key: str) -> Callable[[httpx.Response], Any]:
    adapter = TypeAdapter(list[cls])  # type: ignore[valid-type]
    return lambda response: adapter.validate_python(response.json()[key])


def nothing(response: httpx.Response) -> None:
    return None


# --- paths ----------------------------------------------------------------------------------------------------------


def segment(value: str | int, what: str) -> str:
    """`value` as one path segment that reaches the server as exactly that value: percent-encoded ("/", "?", "#",
    "%" and non-ASCII included), and the dot segments "." and ".." encoded too, which an HTTP client would otherwise
    resolve away (DELETE .../documents/.. would become DELETE of the collection). An empty one is refused."""
    text = str(value)
    if not text:
        raise ValidationError(f"{what} is empty: it would change the path", 422, [{"loc": ["path", what], "msg": "empty"}])
    encoded = quote(text, safe="")
    return encoded.replace(".", "%2E") if text in (".", "..") else encoded


def scope(collection: str | None) -> str:
    """The path prefix of a collection's routes; None: the service's default collection (the unprefixed routes)."""
    return "" if collection is None else f"/collections/{segment(collection, 'collection')}"


def _document_path(collection: str | None, doc_id: str | int) -> str:
    return f"{scope(collection)}/documents/{segment(doc_id, 'id')}"


def _wait(wait: bool | None) -> dict[str, str]:
    return {} if wait is None else {"wait": "true" if wait else "false"}


def _body(value: BaseModel | dict | None) -> dict[str, Any] | None:
    if value is None:
        return None
    return value.body() if hasattr(value, "body") else dict(value)


def search_request(request: SearchRequest | dict | None, spec: dict[str, Any]) -> dict[str, Any]:
    """A search body from a SearchRequest (or its dict) with `spec`'s fields over it."""
    body = _body(request) or {}
    body.update(SearchRequest.model_validate(spec).body() if spec else {})
    return body


def document_json(document: Document | dict, index: int = 0) -> dict[str, Any]:
    """A document's JSON; ValidationError naming `documents[index].field` before anything is sent."""
    if isinstance(document, Document):
        return document.body()
    try:
        return Document.model_validate(document).body()
    except PydanticValidationError as exc:
        detail = [{"loc": ["documents", index, *e["loc"]], "msg": e["msg"], "type": e["type"]} for e in exc.errors()]
        raise error_for(422, detail) from None


# --- operations -----------------------------------------------------------------------------------------------------


def health() -> Call[bool]:
    return Call("GET", "/health", lambda response: response.json().get("status") == "ok")


def ready() -> Call[Ready]:
    # 503 before the service is ready is an answer here, not a failure
    return Call("GET", "/ready", lambda response: Ready.model_validate(response.json()))


def metrics() -> Call[str]:
    return Call("GET", "/metrics", lambda response: response.text)


def reload() -> Call[Ready]:
    return Call("POST", "/admin/reload", model(Ready), idempotent=False)


def list_collections() -> Call[list[CollectionSummary]]:
    return Call("GET", "/collections", listed(CollectionSummary, "collections"))


def create_collection(name: str, settings: CollectionSettings | dict | None) -> Call[CollectionInfo]:
    body: dict[str, Any] = {"name": name}
    if settings is not None:
        body["settings"] = _body(settings)
    return Call("POST", "/collections", model(CollectionInfo), json=body, idempotent=False)


def get_collection(name: str) -> Call[CollectionInfo]:
    return Call("GET", scope(name), model(CollectionInfo))


def update_settings(
    name: str,
    defaults: Defaults | dict | None,
    synonyms: list[SynonymRule | dict] | None,
    curation: list[CurationRule | dict] | None = None,
) -> Call[CollectionInfo]:
    body: dict[str, Any] = {}
    if defaults is not None:
        body["defaults"] = _body(defaults)
    if synonyms is not None:
        body["synonyms"] = [_body(rule) for rule in synonyms]
    if curation is not None:
        body["curation"] = [_body(rule) for rule in curation]
    return Call("PATCH", f"{scope(name)}/settings", model(CollectionInfo), json=body)


def drop_collection(name: str) -> Call[None]:
    return Call("DELETE", scope(name), nothing, gone=lambda: None)


def aliases() -> Call[dict[str, str]]:
    return Call("GET", "/aliases", lambda response: response.json()["aliases"])


def set_alias(alias: str, collection: str) -> Call[dict[str, str]]:
    return Call("PUT", f"/aliases/{segment(alias, 'alias')}", lambda response: response.json()["aliases"], json={"collection": collection})


def drop_alias(alias: str) -> Plan[dict[str, str]]:
    """Drop `alias`: the aliases left (read again when a retry found that an earlier try had dropped it)."""
    left = yield Call("DELETE", f"/aliases/{segment(alias, 'alias')}", lambda response: response.json()["aliases"], gone=lambda: None)
    if left is None:
        left = yield aliases()
    return left


def search(collection: str | None, request: SearchRequest | dict | None, spec: dict[str, Any]) -> Call[SearchResponse]:
    return Call("POST", f"{scope(collection)}/search", model(SearchResponse), json=search_request(request, spec))


def search_batch(collection: str | None, requests: Sequence[SearchRequest | dict]) -> Call[list[SearchResponse]]:
    if not 1 <= len(requests) <= MAX_BATCH_SEARCHES:
        raise ValueError(f"a batch holds 1 to {MAX_BATCH_SEARCHES} searches, got {len(requests)}")
    body = {"searches": [search_request(request, {}) for request in requests]}
    return Call(
        "POST", f"{scope(collection)}/search/batch", lambda response: BatchResponse.model_validate(response.json()).results, json=body
    )


def upsert(collection: str | None, documents: Sequence[Document | dict], wait: bool | None) -> Call[WriteResult]:
    body = {"documents": [document_json(d, i) for i, d in enumerate(documents)]}
    return Call("PUT", f"{scope(collection)}/documents", model(WriteResult), params=_wait(wait), json=body)


def load_batch(collection: str | None, ndjson: bytes) -> Call[Task]:
    """A bulk load of NDJSON documents as a task (an upsert by id: sending it twice loads the same documents)."""
    return Call(
        "PUT", f"{scope(collection)}/documents", model(Task), params={"wait": "false"}, content=ndjson, headers={"Content-Type": NDJSON}
    )


def get_document(collection: str | None, doc_id: str | int) -> Call[StoredDocument]:
    return Call("GET", _document_path(collection, doc_id), model(StoredDocument))


def delete(collection: str | None, ids: Sequence[str | int], wait: bool | None) -> Call[WriteResult]:
    return Call(
        "POST", f"{scope(collection)}/documents/delete", model(WriteResult), params=_wait(wait), json={"ids": [str(i) for i in ids]}
    )


def delete_document(collection: str | None, doc_id: str | int, wait: bool | None) -> Call[WriteResult]:
    return Call("DELETE", _document_path(collection, doc_id), model(WriteResult), params=_wait(wait))


def stats(collection: str | None) -> Call[Stats]:
    return Call("GET", f"{scope(collection)}/stats", model(Stats))


def compact(collection: str | None) -> Call[Stats]:
    path = "/admin/compact" if collection is None else f"{scope(collection)}/compact"
    return Call("POST", path, model(Stats), idempotent=False)


def task(task_id: str) -> Call[Task]:
    return Call("GET", f"/tasks/{segment(task_id, 'task_id')}", model(Task))


def tasks(collection: str | None) -> Call[list[Task]]:
    return Call("GET", "/tasks", listed(Task, "tasks"), params={"collection": collection} if collection else None)


def create_snapshot(collection: str, include_model: bool = False) -> Call[Snapshot]:
    params = {"model": "include"} if include_model else None
    return Call("POST", f"{scope(collection)}/snapshots", model(Snapshot), idempotent=False, params=params)


def snapshots(collection: str | None) -> Call[list[Snapshot]]:
    path = "/snapshots" if collection is None else f"{scope(collection)}/snapshots"
    return Call("GET", path, listed(Snapshot, "snapshots"))


def delete_snapshot(collection: str, snapshot_id: str) -> Call[None]:
    return Call("DELETE", f"{scope(collection)}/snapshots/{segment(snapshot_id, 'snapshot_id')}", nothing, gone=lambda: None)


def snapshot_path(collection: str, snapshot_id: str) -> str:
    return f"{scope(collection)}/snapshots/{segment(snapshot_id, 'snapshot_id')}"


def restore_snapshot(collection: str, snapshot_id: str, replace: bool) -> Call[CollectionInfo]:
    params = {"replace": "true" if replace else "false"}
    return Call(
        "POST",
        f"{scope(collection)}/snapshots/restore",
        model(CollectionInfo),
        params=params,
        json={"snapshot": snapshot_id},
        idempotent=False,
    )


def restore_path(collection: str, replace: bool) -> tuple[str, dict[str, str]]:
    return f"{scope(collection)}/snapshots/restore", {"replace": "true" if replace else "false"}


# --- bulk loads -----------------------------------------------------------------------------------------------------


def read_documents(source: Iterable[Document | dict] | str | Path) -> Iterator[dict[str, Any]]:
    """Documents from an iterable, or from a JSONL file (one document per line; BEIR's `_id` is taken as `id`)."""
    if isinstance(source, (str, Path)):
        with Path(source).open(encoding="utf-8") as lines:
            for number, line in enumerate(lines, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except ValueError as exc:
                    raise ClientError(f"{source}:{number}: not JSON ({exc})") from None
                if "id" not in row and "_id" in row:
                    row["id"] = row.pop("_id")
                yield document_json(row, number - 1)
        return
    for i, document in enumerate(source):
        yield document_json(document, i)


def ndjson_batches(
    documents: Iterator[dict[str, Any]], max_documents: int, max_bytes: int = MAX_REQUEST_BYTES
) -> Iterator[tuple[bytes, int]]:
    """NDJSON request bodies of at most `max_documents` documents and about `max_bytes` bytes: (body, documents)."""
    lines: list[bytes] = []
    size = 0
    for document in documents:
        line = json.dumps(document, ensure_ascii=False).encode() + b"\n"
        if lines and (len(lines) >= max_documents or size + len(line) > max_bytes):
            yield b"".join(lines), len(lines)
            lines, size = [], 0
        lines.append(line)
        size += len(line)
    if lines:
        yield b"".join(lines), len(lines)


@dataclass
class LoadReport:
    """What a bulk load did: its tasks (in order), documents sent and loaded."""

    tasks: list[Task] = field(default_factory=list)
    sent: int = 0

    @property
    def loaded(self) -> int:
        return sum(task.documents_done for task in self.tasks)

    @property
    def last_sequence(self) -> int | None:
        """The sequence number of the last write the load logged."""
        return max((task.last_sequence for task in self.tasks if task.last_sequence is not None), default=None)

    def searchable(self, stats: Stats) -> bool:
        """Whether searches of the collection `stats` describes see every document of the load."""
        return self.last_sequence is None or (stats.visible_sequence or 0) >= self.last_sequence

    def check(self) -> LoadReport:
        failed = [task for task in self.tasks if task.state != "succeeded"]
        if failed:
            raise ClientError(f"task {failed[0].id} {failed[0].state}: {failed[0].error}")
        return self


def progress_bar(progress: bool | Callable[[int, int | None], None], total: int | None) -> Callable[[int, int | None], None]:
    """A callable `(documents done, total)`: the caller's, a tqdm bar (rate and ETA) when `progress` is True, or none."""
    if callable(progress):
        return progress
    if not progress:
        return lambda done, total: None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        raise ClientError("progress=True draws a tqdm bar: pip install tqdm (or pass progress=callable)") from None
    bar = tqdm(total=total, unit=" docs", desc="loading", dynamic_ncols=True)

    def update(done: int, new_total: int | None) -> None:
        if new_total is not None and bar.total != new_total:
            bar.total = new_total
        bar.update(done - bar.n)
        if new_total is not None and done >= new_total:
            bar.close()

    return update


TASK_POLL_SECONDS = 0.2


def load(
    collection: str | None, documents: Iterable[Document | dict] | str | Path, batch_documents: int, progress: Any
) -> Plan[LoadReport]:
    """A bulk load: tasks of `batch_documents` documents, one after another (a later version of a document wins),
    each followed to its end, then until searches see the last of them."""
    report = LoadReport()
    update = progress_bar(progress, count_documents(documents) if progress else None)
    for body, count in ndjson_batches(read_documents(documents), batch_documents):
        running = yield load_batch(collection, body)
        report.sent += count
        while not running.finished:
            update(report.loaded + running.documents_done, None)
            yield TASK_POLL_SECONDS
            running = yield task(running.id)
        report.tasks.append(running)
        update(report.loaded, None)
        report.check()
    while not report.searchable((yield stats(collection))):
        yield TASK_POLL_SECONDS  # searchable within the service's refresh interval
    update(report.loaded, report.sent)
    return report


def count_documents(source: Iterable[Document | dict] | str | Path) -> int | None:
    """How many documents a load will send, when that is known before reading them (a file: its lines, read once
    more for the progress bar's total)."""
    if isinstance(source, (str, Path)):
        with Path(source).open("rb") as lines:
            return sum(1 for line in lines if line.strip())
    return len(source) if isinstance(source, Sized) else None
