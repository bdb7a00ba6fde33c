"""FastAPI application: create_app() wires settings, the collections, the middleware, the routers and the error
answers."""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from importlib.metadata import version
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, params
from fastapi.middleware.cors import CORSMiddleware
from threadpoolctl import threadpool_limits

from hybrid_retrieval.app import api_docs, ui
from hybrid_retrieval.app.budget import Deadlines
from hybrid_retrieval.app.errors import add_error_handlers
from hybrid_retrieval.app.limits import BodySizeLimit
from hybrid_retrieval.app.observability import Metrics, RequestContext
from hybrid_retrieval.app.routes import aliases, collections, documents, operations, search, snapshots, tasks
from hybrid_retrieval.app.routes.shared import named_collection
from hybrid_retrieval.app.security import InFlightLimit, Keys
from hybrid_retrieval.app.settings import Settings
from hybrid_retrieval.common.errors import HybridError
from hybrid_retrieval.engine.collections import Collections
from hybrid_retrieval.engine.serving import Resources, load_reranker, open_folder
from hybrid_retrieval.engine.tasks import Tasks
from hybrid_retrieval.indexer.store import OpenIndex
from hybrid_retrieval.models.providers import onnx_providers

logger = logging.getLogger(__name__)

Opener = Callable[[], object]  # opens the --index collection, whole or sharded (engine.serving.Reloader)


def create_app(
    settings: Settings | None = None, index: OpenIndex | None = None, cross_encoder: object | None = None, opener: Opener | None = None
) -> FastAPI:
    """Build the app; the collections (and the reranker's cross-encoder) are opened once at startup unless injected.
    `index`: an index opened by the caller, served as the --index collection; `opener()` opens that collection at
    startup and on each reload instead (cluster.serve passes one whose shards answer from Ray Serve)."""
    settings = settings or Settings()
    if index is not None and settings.index is None:  # served as --index would serve its folder
        settings = settings.model_copy(update={"index": index.path})
    app = FastAPI(
        title="Hybrid retrieval",
        version=version("hybrid-retrieval"),  # the installed package's, from its metadata
        summary="BM25 + dense retrieval with score fusion",
        lifespan=_lifespan(settings, cross_encoder, opener or (_injected(index, settings) if index is not None else None)),
        docs_url=None,  # served by app.api_docs from the package, not a CDN
        redoc_url=None,
    )
    app.state.collections = None
    app.state.metrics = Metrics()
    app.state.keys = Keys.load(settings)
    app.state.in_flight = InFlightLimit(settings.max_in_flight)
    app.state.deadlines = Deadlines(settings.request_timeout, settings.write_timeout)
    _add_middleware(app, settings)
    _include_routes(app)
    add_error_handlers(app)
    return app


def _injected(index: OpenIndex, settings: Settings) -> Opener:
    """An opener that serves an index opened by the caller first, and on reload the folder it came from."""
    pending = [index]

    def opener() -> object:
        return pending.pop() if pending else open_folder(settings.index or index.path, settings)

    return opener


def _lifespan(
    settings: Settings, cross_encoder: object | None, opener: Opener | None
) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """Open the collections and start the refresher at startup; stop the work in progress and close them at shutdown."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # A request's NumPy products are small; a BLAS pool spinning beside ONNX Runtime's would take cores from searches
        # (docs/deployment.md).
        blas = threadpool_limits(settings.blas_threads, user_api="blas")
        executor = ThreadPoolExecutor(thread_name_prefix="bm25-leg") if _parallel_legs(settings) else None
        app.state.search_executor = ThreadPoolExecutor(settings.search_workers, thread_name_prefix="search")
        batch = _batch_queries(settings)
        reranker = cross_encoder or load_reranker(settings, batch)
        resources = Resources(settings, app.state.metrics, app.state.in_flight, executor, reranker, batch)
        collections = Collections.from_settings(resources, settings, opener)
        try:
            collections.open_all()
        except HybridError as exc:  # the --index folder's damaged log: the message names the file, record and repair
            logger.error("cannot serve: %s", exc)
            raise
        app.state.collections = collections
        app.state.tasks = Tasks(collections.tasks_folder, settings.task_workers)
        _reload_on_sighup(app)
        stop = threading.Event()
        upkeep = threading.Thread(target=_upkeep_loop, args=(collections, settings.refresh_interval, stop), name="refresher", daemon=True)
        upkeep.start()
        yield
        app.state.deadlines.cancel_all("the service is shutting down")  # nobody will read what they would answer
        app.state.tasks.close()  # a load in progress stops after its current batch: what it acknowledged is durable
        stop.set()
        upkeep.join()  # no compaction starts after this
        collections.close()
        app.state.search_executor.shutdown(wait=True)
        if executor is not None:
            executor.shutdown(wait=True)
        blas.restore_original_limits()

    return lifespan


def _on_gpu(settings: Settings) -> bool:
    """Whether the service's models run on CUDA (the policies below pay only there)."""
    return "CUDAExecutionProvider" in onnx_providers(settings.device)


def _parallel_legs(settings: Settings) -> bool:
    if settings.parallel_legs != "auto":
        return settings.parallel_legs == "on"
    return _on_gpu(settings)


def _batch_queries(settings: Settings) -> bool:
    if settings.batch_queries != "auto":
        return settings.batch_queries == "on"
    return _on_gpu(settings)


def _upkeep_loop(collections: Collections, interval: float, stop: threading.Event) -> None:
    """Publish writes to searches every `interval` seconds (a write with ?wait=true publishes at once), and serve the
    collections an offline build published into the data directory."""
    while not stop.wait(interval):
        collections.refresh()
        try:
            collections.scan()
        except Exception:
            logger.exception("scanning the data directory failed")


def _reload_on_sighup(app: FastAPI) -> None:
    """`kill -HUP <pid>` reloads every collection, where the event loop runs in the main thread."""
    loop = asyncio.get_running_loop()

    def reload_logged() -> None:
        try:
            app.state.collections.reload()
        except Exception:
            logger.exception("reload on SIGHUP failed: still serving the previous index")

    try:
        loop.add_signal_handler(signal.SIGHUP, lambda: loop.run_in_executor(None, reload_logged))
    except (NotImplementedError, RuntimeError, ValueError):  # not the main thread (tests) or no signals
        logger.debug("SIGHUP reload not available here")


def _add_middleware(app: FastAPI, settings: Settings) -> None:
    app.add_middleware(
        BodySizeLimit,
        max_bytes=settings.max_body_bytes,
        write_max_bytes=settings.max_write_body_bytes,
        upload_max_bytes=settings.max_snapshot_bytes,
    )
    app.add_middleware(RequestContext, metrics=app.state.metrics)  # added last: outermost, so it sees every response
    origins = [o.strip() for o in settings.cors_origins.split(",") if o.strip()]
    if origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=origins,
            allow_methods=["GET", "POST", "PUT", "PATCH", "DELETE"],
            allow_headers=["Authorization", "X-API-Key", "Content-Type"],
        )


# The routes of one collection serve twice: the default collection's unprefixed, and any collection's (or alias's)
# under /collections/{name}, whose dependency names it. (prefix, dependencies, tag, the compaction's router)
_COLLECTION_MOUNTS: list[tuple[str, list[params.Depends], str, APIRouter]] = [
    ("", [], "default collection", documents.default_compaction),
    ("/collections/{name}", [Depends(named_collection)], "collections", documents.named_compaction),
]
_NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"description": "no such collection or alias (unprefixed routes: no default collection)"}
}
# In the order routes match: a path's first route answers a method the path lacks (405 with its own Allow).
_SERVICE_ROUTERS = (
    operations.router,
    operations.admin,
    collections.reads,
    collections.writes,
    aliases.reads,
    aliases.writes,
    tasks.router,
    snapshots.reads,
    snapshots.writes,
)


def _include_routes(app: FastAPI) -> None:
    for router in _SERVICE_ROUTERS:
        app.include_router(router)
    for prefix, dependencies, tag, compaction in _COLLECTION_MOUNTS:
        for router in (search.router, documents.writes, documents.reads, compaction):
            app.include_router(router, prefix=prefix, dependencies=dependencies, tags=[tag], responses=_NOT_FOUND)
    app.include_router(ui.router)
    app.include_router(api_docs.router)
