"""FastAPI application: create_app() wires settings, the index and the routes."""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from importlib.metadata import version

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse
from threadpoolctl import threadpool_limits

from hybrid_retrieval.app.api_docs import router as api_docs_router
from hybrid_retrieval.app.budget import Deadlines
from hybrid_retrieval.app.documents import document_routes
from hybrid_retrieval.app.json_body import body_loc
from hybrid_retrieval.app.lifecycle import router as lifecycle_router
from hybrid_retrieval.app.limits import BodySizeLimit
from hybrid_retrieval.app.observability import Metrics, RequestContext
from hybrid_retrieval.app.routes import default_collection, named_collection, search_routes, service_router
from hybrid_retrieval.app.security import InFlightLimit, Keys
from hybrid_retrieval.app.settings import Settings
from hybrid_retrieval.app.snapshot_routes import router as snapshot_router
from hybrid_retrieval.app.ui import router as ui_router
from hybrid_retrieval.common.errors import (
    BadSnapshot,
    Conflict,
    DeadlineExceeded,
    HybridError,
    NotFound,
    SnapshotNotFound,
    SpecError,
    StorageError,
    TooMany,
    Unavailable,
)
from hybrid_retrieval.engine.collections import Collections
from hybrid_retrieval.engine.serving import Resources, load_reranker, open_folder
from hybrid_retrieval.engine.tasks import Tasks
from hybrid_retrieval.indexer.store import OpenIndex
from hybrid_retrieval.models.providers import onnx_providers

logger = logging.getLogger(__name__)


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

    def reload_logged():
        try:
            app.state.collections.reload()
        except Exception:
            logger.exception("reload on SIGHUP failed: still serving the previous index")

    try:
        loop.add_signal_handler(signal.SIGHUP, lambda: loop.run_in_executor(None, reload_logged))
    except (NotImplementedError, RuntimeError, ValueError):  # not the main thread (tests) or no signals
        logger.debug("SIGHUP reload not available here")


def _injected(index: OpenIndex, settings: Settings):
    """An opener that serves an index opened by the caller first, and on reload the folder it came from."""
    pending = [index]

    def opener():
        return pending.pop() if pending else open_folder(settings.index or index.path, settings)

    return opener


def create_app(settings: Settings | None = None, index: OpenIndex | None = None, cross_encoder=None, opener=None) -> FastAPI:
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
    _handle_errors(app)
    return app


def _lifespan(settings: Settings, cross_encoder, opener):
    """Open the collections and start the refresher at startup; stop the work in progress and close them at shutdown."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
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


def _include_routes(app: FastAPI) -> None:
    app.include_router(service_router)
    app.include_router(lifecycle_router)
    app.include_router(snapshot_router)
    missing = {404: {"description": "no such collection or alias (unprefixed routes: no default collection)"}}
    for routes in (search_routes(default_collection), document_routes(default_collection, compact_path="/admin/compact")):
        app.include_router(routes, tags=["default collection"], responses=missing)
    for routes in (search_routes(named_collection), document_routes(named_collection, compact_path="/compact")):
        app.include_router(routes, prefix="/collections/{name}", tags=["collections"], responses=missing)
    app.include_router(ui_router)
    app.include_router(api_docs_router)


# Domain errors answered with their message alone, by status (the most specific class wins: Unavailable is a NotFound).
PLAIN_STATUSES: dict[type[Exception], int] = {
    NotFound: 404,
    SnapshotNotFound: 404,
    Conflict: 409,
    TooMany: 409,
    Unavailable: 503,
}


def _plain(status: int):
    async def handler(request: Request, exc: Exception):
        return JSONResponse(status_code=status, content={"detail": str(exc)})

    return handler


def _handle_errors(app: FastAPI) -> None:
    """Every domain error as its HTTP status; anything else a logged 500."""
    for kind, status in PLAIN_STATUSES.items():
        app.add_exception_handler(kind, _plain(status))

    @app.exception_handler(RequestValidationError)
    async def _invalid_request(request: Request, exc: RequestValidationError):
        # Echo where and what, never the input: it may be huge, or NaN, which JSON cannot carry.
        detail = [{"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]} for e in exc.errors()]
        return JSONResponse(status_code=422, content={"detail": detail})

    @app.exception_handler(SpecError)
    async def _spec_error(request: Request, exc: SpecError):
        # the same shape as request validation errors: where (the field's path in the body, names kept whole) and what
        return JSONResponse(status_code=422, content={"detail": [{"loc": list(body_loc(exc)), "msg": str(exc), "type": "value_error"}]})

    @app.exception_handler(BadSnapshot)
    async def _bad_snapshot(request: Request, exc: BadSnapshot):
        return JSONResponse(status_code=422, content={"detail": [{"loc": ["body"], "msg": str(exc), "type": "value_error"}]})

    @app.exception_handler(StorageError)
    async def _storage_error(request: Request, exc: StorageError):
        # nothing was written: 507 when the disk is full, 503 when the folder cannot be written (stats say why)
        status = 507 if exc.kind == StorageError.FULL else 503
        return JSONResponse(status_code=status, content={"detail": str(exc)})

    @app.exception_handler(DeadlineExceeded)
    async def _deadline(request: Request, exc: DeadlineExceeded):
        return JSONResponse(status_code=504, content={"detail": f"the request {exc}"})

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):
        logger.exception("unhandled error on %s", request.url.path)
        return JSONResponse(status_code=500, content={"detail": "internal server error"})
