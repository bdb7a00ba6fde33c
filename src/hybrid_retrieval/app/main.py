"""FastAPI application: create_app() wires settings, the index and the routes."""

from __future__ import annotations

import asyncio
import functools
import logging
import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse
from threadpoolctl import threadpool_limits

from hybrid_retrieval.app.budget import Deadlines
from hybrid_retrieval.app.documents import router as documents_router
from hybrid_retrieval.app.json_body import body_loc
from hybrid_retrieval.app.limits import BodySizeLimit
from hybrid_retrieval.app.observability import Metrics, RequestContext
from hybrid_retrieval.app.routes import router
from hybrid_retrieval.app.security import InFlightLimit, load_api_keys, load_write_keys
from hybrid_retrieval.app.serving import Reloader, load_reranker, open_configured
from hybrid_retrieval.app.settings import Settings
from hybrid_retrieval.app.ui import router as ui_router
from hybrid_retrieval.indexer.store import OpenIndex
from hybrid_retrieval.models.providers import on_gpu
from hybrid_retrieval.search.errors import DeadlineExceeded, HybridError, SpecError, StorageError

logger = logging.getLogger(__name__)


def _parallel_legs(settings: Settings, index: OpenIndex) -> bool:
    if settings.parallel_legs != "auto":
        return settings.parallel_legs == "on"
    return on_gpu(index.embedder)


def _batch_queries(settings: Settings, index: OpenIndex) -> bool:
    if settings.batch_queries != "auto":
        return settings.batch_queries == "on"
    return on_gpu(index.embedder)


def _refresh_loop(app: FastAPI, interval: float, stop: threading.Event) -> None:
    """Publish writes to searches every `interval` seconds (a write with ?wait=true publishes at once)."""
    while not stop.wait(interval):
        try:
            app.state.reloader.refresh()
        except Exception:  # a failed refresh keeps the previous snapshot in service; the next one retries
            logger.exception("refresh failed")


def _reload_on_sighup(app: FastAPI) -> None:
    """`kill -HUP <pid>` reloads the index, where the event loop runs in the main thread."""
    loop = asyncio.get_running_loop()

    def reload_logged():
        try:
            app.state.reloader.reload()
        except Exception:
            logger.exception("reload on SIGHUP failed: still serving the previous index")

    try:
        loop.add_signal_handler(signal.SIGHUP, lambda: loop.run_in_executor(None, reload_logged))
    except (NotImplementedError, RuntimeError, ValueError):  # not the main thread (tests) or no signals
        logger.debug("SIGHUP reload not available here")


def create_app(settings: Settings | None = None, index: OpenIndex | None = None, cross_encoder=None, opener=None) -> FastAPI:
    """Build the app; the index (and the reranker's cross-encoder) are opened once at startup unless injected (tests).
    `opener()` opens the index at startup and on each reload (default: the settings' index, whole or sharded, in this
    process; cluster.serve passes one whose shards answer from Ray Serve)."""
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        # A request's NumPy products are small; a BLAS pool spinning beside ONNX Runtime's would take cores from searches
        # (under 16 searching clients and 2 writers: docs/BENCHMARKS.md, "Live writes").
        blas = threadpool_limits(settings.blas_threads, user_api="blas")
        opened = index
        if opened is None:
            if settings.index is None:
                raise RuntimeError("no index configured: pass --index DIR or set HYBRID_INDEX")
            logger.info("opening index %s (verify=%s)", settings.index, settings.verify)
            opened = (opener or functools.partial(open_configured, settings))()
        executor = ThreadPoolExecutor(thread_name_prefix="bm25-leg") if _parallel_legs(settings, opened) else None
        app.state.search_executor = ThreadPoolExecutor(settings.search_workers, thread_name_prefix="search")
        batch = _batch_queries(settings, opened)
        app.state.reloader = Reloader(app, settings, executor, cross_encoder or load_reranker(settings, batch), batch, opener)
        try:
            app.state.reloader.open(opened)
        except HybridError as exc:  # a damaged write-ahead log: the message names the file, the record and the repair
            logger.error("cannot serve %s: %s", opened.path, exc)
            raise
        _reload_on_sighup(app)
        stop = threading.Event()
        refresher = threading.Thread(target=_refresh_loop, args=(app, settings.refresh_interval, stop), name="refresher", daemon=True)
        refresher.start()
        yield
        app.state.deadlines.cancel_all("the service is shutting down")  # nobody will read what they would answer
        stop.set()
        refresher.join()  # no compaction starts after this
        app.state.reloader.wait_for_compaction()
        serving, app.state.serving = app.state.serving, None
        if serving is not None and serving.collection is not None:
            serving.collection.close()
        app.state.search_executor.shutdown(wait=True)
        if executor is not None:
            executor.shutdown(wait=True)
        blas.restore_original_limits()

    app = FastAPI(
        title="Hybrid retrieval",
        version="0.1.0",
        summary="BM25 + dense retrieval with rank fusion",
        lifespan=lifespan,
    )
    app.state.serving = None
    app.state.metrics = metrics = Metrics()
    app.state.api_keys = load_api_keys(settings)
    app.state.write_keys = load_write_keys(settings)
    app.state.in_flight = InFlightLimit(settings.max_in_flight)
    app.state.deadlines = Deadlines(settings.request_timeout, settings.write_timeout)
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes, write_max_bytes=settings.max_write_body_bytes)
    app.add_middleware(RequestContext, metrics=metrics)  # added last: outermost, so it sees every response
    origins = [o.strip() for o in settings.cors_origins.split(",") if o.strip()]
    if origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=origins,
            allow_methods=["GET", "POST", "PUT", "DELETE"],
            allow_headers=["Authorization", "X-API-Key", "Content-Type"],
        )
    app.include_router(router)
    app.include_router(documents_router)
    app.include_router(ui_router)

    @app.exception_handler(RequestValidationError)
    async def _invalid_request(request: Request, exc: RequestValidationError):
        # Echo where and what, never the input: it may be huge, or NaN, which JSON cannot carry.
        detail = [{"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]} for e in exc.errors()]
        return JSONResponse(status_code=422, content={"detail": detail})

    @app.exception_handler(SpecError)
    async def _spec_error(request: Request, exc: SpecError):
        # the same shape as request validation errors: where (the field's path in the body, names kept whole) and what
        return JSONResponse(status_code=422, content={"detail": [{"loc": list(body_loc(exc)), "msg": str(exc), "type": "value_error"}]})

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

    return app
