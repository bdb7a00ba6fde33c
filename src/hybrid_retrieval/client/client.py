"""`Client` and `AsyncClient`: every route of the service as a typed method, over one pooled HTTP connection set.

Both send the same `calls.Call`s under the same `Retry` policy; a method of one is the method of the other, awaited.
`collection=None` means the service's default collection (the unprefixed routes).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import httpx

from hybrid_retrieval.client import calls
from hybrid_retrieval.client.calls import Call, LoadReport, Retry
from hybrid_retrieval.client.models import (
    CollectionInfo,
    CollectionSettings,
    CollectionSummary,
    CurationRule,
    Defaults,
    Document,
    Hit,
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
DEFAULT_URL = "http://127.0.0.1:8000"
MAX_OFFSET = 10_000  # the server pages through at most this many hits
Progress = bool | Callable[[int, int | None], None]


def _headers(api_key: str | None, headers: dict[str, str] | None) -> dict[str, str]:
    return {**({"X-API-Key": api_key} if api_key else {}), **(headers or {})}


class Client:
    """A blocking client. Use it as a context manager, or call close().

    >>> with Client("http://127.0.0.1:8000", api_key="...") as client:
    ...     hits = client.search("products", query="waterproof jacket", k=5).hits
    """

    def __init__(
        self,
        url: str = DEFAULT_URL,
        api_key: str | None = None,
        timeout: float | httpx.Timeout = 30.0,
        retry: Retry | None = None,
        headers: dict[str, str] | None = None,
        http: httpx.Client | None = None,
    ):
        """`timeout`: seconds per request (an httpx.Timeout for finer control); `retry`: when idempotent calls are sent
        again (calls.Retry; calls.NO_RETRY for never); `http`: an httpx.Client of your own (its pool, proxies, TLS)."""
        self.retry = retry or Retry()
        self._http = http or httpx.Client(base_url=url, timeout=timeout)
        self._headers = _headers(api_key, headers)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def send(self, call: Call[T]) -> T:
        """Send `call`, again while the retry policy says so; its result, or the typed error of its answer."""
        unsure = False
        for attempt in itertools.count():
            try:
                outcome: httpx.Response | httpx.TransportError = self._http.send(call.request(self._http, self._headers))
            except httpx.TransportError as exc:
                outcome = exc
            done, value = calls.settle(call, self.retry, attempt, outcome, unsure)
            if done:
                return value
            unsure = unsure or calls.may_have_acted(outcome)
            time.sleep(value)
        raise AssertionError("unreachable")

    def _run(self, plan: calls.Plan[T]) -> T:
        """Carry out a plan: send the calls it yields, pause as it says, until it returns."""
        try:
            step = next(plan)
            while True:
                if isinstance(step, Call):
                    step = plan.send(self.send(step))
                else:
                    time.sleep(step)
                    step = plan.send(None)
        except StopIteration as finished:
            return finished.value

    # --- service ---------------------------------------------------------------------------------------------------

    def health(self) -> bool:
        return self.send(calls.health())

    def ready(self) -> Ready:
        return self.send(calls.ready())

    def metrics(self) -> str:
        return self.send(calls.metrics())

    def reload(self) -> Ready:
        return self.send(calls.reload())

    # --- collections and aliases -----------------------------------------------------------------------------------

    def list_collections(self) -> list[CollectionSummary]:
        return self.send(calls.list_collections())

    def create_collection(self, name: str, settings: CollectionSettings | dict | None = None) -> CollectionInfo:
        return self.send(calls.create_collection(name, settings))

    def get_collection(self, name: str) -> CollectionInfo:
        return self.send(calls.get_collection(name))

    def update_settings(
        self,
        name: str,
        defaults: Defaults | dict | None = None,
        synonyms: list[SynonymRule | dict] | None = None,
        curation: list[CurationRule | dict] | None = None,
    ) -> CollectionInfo:
        """Change what needs no rebuild: fields of the default search spec, the synonym rules and the curation rules
        (each replaced whole)."""
        return self.send(calls.update_settings(name, defaults, synonyms, curation))

    def drop_collection(self, name: str) -> None:
        return self.send(calls.drop_collection(name))

    def aliases(self) -> dict[str, str]:
        return self.send(calls.aliases())

    def set_alias(self, alias: str, collection: str) -> dict[str, str]:
        return self.send(calls.set_alias(alias, collection))

    def drop_alias(self, alias: str) -> dict[str, str]:
        return self._run(calls.drop_alias(alias))

    # --- search ----------------------------------------------------------------------------------------------------

    def search(self, collection: str | None = None, request: SearchRequest | dict | None = None, **spec: Any) -> SearchResponse:
        """One search: a SearchRequest, and/or its fields as keywords (query=..., k=..., fusion=RRF(rrf_k=30), ...)."""
        return self.send(calls.search(collection, request, spec))

    def search_batch(self, collection: str | None, requests: Sequence[SearchRequest | dict]) -> list[SearchResponse]:
        """Up to 64 searches in one request (their queries embedded in one model run)."""
        return self.send(calls.search_batch(collection, requests))

    def iter_hits(
        self, collection: str | None = None, request: SearchRequest | dict | None = None, page_size: int = 100, **spec: Any
    ) -> Iterator[Hit]:
        """Every hit of a search, page after page (`offset` advancing by `page_size`), until there are no more."""
        body = calls.search_request(request, spec)
        offset = body.pop("offset", 0)
        while offset < MAX_OFFSET:
            page = self.search(collection, {**body, "k": page_size, "offset": offset})
            yield from page.hits
            if not page.has_more or not page.hits:
                return
            offset += len(page.hits)

    # --- documents -------------------------------------------------------------------------------------------------

    def upsert(self, collection: str | None, documents: Sequence[Document | dict], wait: bool | None = None) -> WriteResult:
        """Upsert up to the server's batch limit (1,000) by id, all or nothing. `wait`: True answers once searchable."""
        return self.send(calls.upsert(collection, documents, wait))

    def load(
        self,
        collection: str | None,
        documents: Iterable[Document | dict] | str | Path,
        batch_documents: int = 10_000,
        progress: Progress = False,
    ) -> LoadReport:
        """Load any number of documents (an iterable, or a JSONL file streamed line by line) as bulk-load tasks of
        `batch_documents` documents (NDJSON, at most ~8 MiB a request), one after another so that a later version of
        a document wins; returns once every document is searchable, raising if a task failed. `progress`: True draws a tqdm
        bar with rate and ETA, or a callable(done, total)."""
        return self._run(calls.load(collection, documents, batch_documents, progress))

    def get_document(self, collection: str | None, doc_id: str | int) -> StoredDocument:
        return self.send(calls.get_document(collection, doc_id))

    def delete(self, collection: str | None, ids: Sequence[str | int], wait: bool | None = None) -> WriteResult:
        return self.send(calls.delete(collection, ids, wait))

    def delete_document(self, collection: str | None, doc_id: str | int, wait: bool | None = None) -> WriteResult:
        return self.send(calls.delete_document(collection, doc_id, wait))

    def stats(self, collection: str | None = None) -> Stats:
        return self.send(calls.stats(collection))

    def compact(self, collection: str | None = None) -> Stats:
        return self.send(calls.compact(collection))

    def task(self, task_id: str) -> Task:
        return self.send(calls.task(task_id))

    def tasks(self, collection: str | None = None) -> list[Task]:
        return self.send(calls.tasks(collection))

    # --- snapshots -------------------------------------------------------------------------------------------------

    def create_snapshot(self, collection: str, include_model: bool = False) -> Snapshot:
        """A consistent snapshot; `include_model`: copy the model's files in, so it restores where that model is not."""
        return self.send(calls.create_snapshot(collection, include_model))

    def snapshots(self, collection: str | None = None) -> list[Snapshot]:
        """A collection's snapshots, or every snapshot (None), oldest first."""
        return self.send(calls.snapshots(collection))

    def delete_snapshot(self, collection: str, snapshot_id: str) -> None:
        return self.send(calls.delete_snapshot(collection, snapshot_id))

    def download_snapshot(self, collection: str, snapshot_id: str, to: str | Path) -> Path:
        """Stream a snapshot file to `to` (a file, or a folder to put `<id>.snapshot` in)."""
        target = Path(to) / f"{snapshot_id}.snapshot" if Path(to).is_dir() else Path(to)
        with self._http.stream("GET", calls.snapshot_path(collection, snapshot_id), headers=self._headers) as response:
            if not response.is_success:
                response.read()
                calls.check(response)
            with target.open("wb") as out:
                for chunk in response.iter_bytes(1 << 20):
                    out.write(chunk)
        return target

    def restore_snapshot(
        self, collection: str, snapshot_id: str | None = None, file: str | Path | None = None, replace: bool = False
    ) -> CollectionInfo:
        """Restore a listed snapshot (`snapshot_id`) or upload a snapshot `file` as `collection`: a new one, or with
        `replace` in place of the existing one, atomically."""
        if (snapshot_id is None) == (file is None):
            raise ValueError("give snapshot_id or file")
        if snapshot_id is not None:
            return self.send(calls.restore_snapshot(collection, snapshot_id, replace))
        path, params = calls.restore_path(collection, replace)
        with Path(file).open("rb") as body:  # type: ignore[arg-type]
            headers = {**self._headers, "Content-Type": "application/octet-stream"}
            response = self._http.post(path, params=params, content=body, headers=headers)
        calls.check(response)
        return CollectionInfo.model_validate(response.json())


class AsyncClient:
    """The same methods as `Client`, awaited: `async with AsyncClient(url) as client: await client.search(...)`."""

    def __init__(
        self,
        url: str = DEFAULT_URL,
        api_key: str | None = None,
        timeout: float | httpx.Timeout = 30.0,
        retry: Retry | None = None,
        headers: dict[str, str] | None = None,
        http: httpx.AsyncClient | None = None,
    ):
        self.retry = retry or Retry()
        self._http = http or httpx.AsyncClient(base_url=url, timeout=timeout)
        self._headers = _headers(api_key, headers)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._http.aclose()

    async def send(self, call: Call[T]) -> T:
        unsure = False
        for attempt in itertools.count():
            try:
                outcome: httpx.Response | httpx.TransportError = await self._http.send(call.request(self._http, self._headers))
            except httpx.TransportError as exc:
                outcome = exc
            done, value = calls.settle(call, self.retry, attempt, outcome, unsure)
            if done:
                return value
            unsure = unsure or calls.may_have_acted(outcome)
            await asyncio.sleep(value)
        raise AssertionError("unreachable")

    async def _run(self, plan: calls.Plan[T]) -> T:
        try:
            step = next(plan)
            while True:
                if isinstance(step, Call):
                    step = plan.send(await self.send(step))
                else:
                    await asyncio.sleep(step)
                    step = plan.send(None)
        except StopIteration as finished:
            return finished.value

    async def health(self) -> bool:
        return await self.send(calls.health())

    async def ready(self) -> Ready:
        return await self.send(calls.ready())

    async def metrics(self) -> str:
        return await self.send(calls.metrics())

    async def reload(self) -> Ready:
        return await self.send(calls.reload())

    async def list_collections(self) -> list[CollectionSummary]:
        return await self.send(calls.list_collections())

    async def create_collection(self, name: str, settings: CollectionSettings | dict | None = None) -> CollectionInfo:
        return await self.send(calls.create_collection(name, settings))

    async def get_collection(self, name: str) -> CollectionInfo:
        return await self.send(calls.get_collection(name))

    async def update_settings(
        self,
        name: str,
        defaults: Defaults | dict | None = None,
        synonyms: list[SynonymRule | dict] | None = None,
        curation: list[CurationRule | dict] | None = None,
    ) -> CollectionInfo:
        """As Client.update_settings."""
        return await self.send(calls.update_settings(name, defaults, synonyms, curation))

    async def drop_collection(self, name: str) -> None:
        return await self.send(calls.drop_collection(name))

    async def aliases(self) -> dict[str, str]:
        return await self.send(calls.aliases())

    async def set_alias(self, alias: str, collection: str) -> dict[str, str]:
        return await self.send(calls.set_alias(alias, collection))

    async def drop_alias(self, alias: str) -> dict[str, str]:
        return await self._run(calls.drop_alias(alias))

    async def search(self, collection: str | None = None, request: SearchRequest | dict | None = None, **spec: Any) -> SearchResponse:
        return await self.send(calls.search(collection, request, spec))

    async def search_batch(self, collection: str | None, requests: Sequence[SearchRequest | dict]) -> list[SearchResponse]:
        return await self.send(calls.search_batch(collection, requests))

    async def iter_hits(
        self, collection: str | None = None, request: SearchRequest | dict | None = None, page_size: int = 100, **spec: Any
    ) -> AsyncIterator[Hit]:
        body = calls.search_request(request, spec)
        offset = body.pop("offset", 0)
        while offset < MAX_OFFSET:
            page = await self.search(collection, {**body, "k": page_size, "offset": offset})
            for hit in page.hits:
                yield hit
            if not page.has_more or not page.hits:
                return
            offset += len(page.hits)

    async def upsert(self, collection: str | None, documents: Sequence[Document | dict], wait: bool | None = None) -> WriteResult:
        return await self.send(calls.upsert(collection, documents, wait))

    async def load(
        self,
        collection: str | None,
        documents: Iterable[Document | dict] | str | Path,
        batch_documents: int = 10_000,
        progress: Progress = False,
    ) -> LoadReport:
        return await self._run(calls.load(collection, documents, batch_documents, progress))

    async def get_document(self, collection: str | None, doc_id: str | int) -> StoredDocument:
        return await self.send(calls.get_document(collection, doc_id))

    async def delete(self, collection: str | None, ids: Sequence[str | int], wait: bool | None = None) -> WriteResult:
        return await self.send(calls.delete(collection, ids, wait))

    async def delete_document(self, collection: str | None, doc_id: str | int, wait: bool | None = None) -> WriteResult:
        return await self.send(calls.delete_document(collection, doc_id, wait))

    async def stats(self, collection: str | None = None) -> Stats:
        return await self.send(calls.stats(collection))

    async def compact(self, collection: str | None = None) -> Stats:
        return await self.send(calls.compact(collection))

    async def task(self, task_id: str) -> Task:
        return await self.send(calls.task(task_id))

    async def tasks(self, collection: str | None = None) -> list[Task]:
        return await self.send(calls.tasks(collection))

    async def create_snapshot(self, collection: str, include_model: bool = False) -> Snapshot:
        return await self.send(calls.create_snapshot(collection, include_model))

    async def snapshots(self, collection: str | None = None) -> list[Snapshot]:
        return await self.send(calls.snapshots(collection))

    async def delete_snapshot(self, collection: str, snapshot_id: str) -> None:
        return await self.send(calls.delete_snapshot(collection, snapshot_id))

    async def download_snapshot(self, collection: str, snapshot_id: str, to: str | Path) -> Path:
        target = Path(to) / f"{snapshot_id}.snapshot" if Path(to).is_dir() else Path(to)
        async with self._http.stream("GET", calls.snapshot_path(collection, snapshot_id), headers=self._headers) as response:
            if not response.is_success:
                await response.aread()
                calls.check(response)
            with target.open("wb") as out:
                async for chunk in response.aiter_bytes(1 << 20):
                    out.write(chunk)
        return target

    async def restore_snapshot(
        self, collection: str, snapshot_id: str | None = None, file: str | Path | None = None, replace: bool = False
    ) -> CollectionInfo:
        if (snapshot_id is None) == (file is None):
            raise ValueError("give snapshot_id or file")
        if snapshot_id is not None:
            return await self.send(calls.restore_snapshot(collection, snapshot_id, replace))
        path, params = calls.restore_path(collection, replace)

        async def chunks() -> AsyncIterator[bytes]:
            with Path(file).open("rb") as body:  # type: ignore[arg-type]
                while block := body.read(1 << 20):
                    yield block

        headers = {**self._headers, "Content-Type": "application/octet-stream"}
        response = await self._http.post(path, params=params, content=chunks(), headers=headers)
        calls.check(response)
        return CollectionInfo.model_validate(response.json())
