"""Request ids, JSON logs and Prometheus metrics for the service."""

from __future__ import annotations

import contextvars
import json
import logging
import re
import time
import uuid
from datetime import datetime

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hybrid_retrieval.indexer.manifest import FORMAT_VERSION, Manifest

logger = logging.getLogger("app.access")
request_id_var: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")
_SAFE_ID = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
STAGE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class Metrics:
    """One registry per app, so several apps (tests, reloads) never collide."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("hybrid_requests", "HTTP requests by route and status", ["path", "status"], registry=self.registry)
        self.stage_seconds = Histogram(
            "hybrid_stage_seconds", "search time per pipeline stage", ["stage"], buckets=STAGE_BUCKETS, registry=self.registry
        )
        self.documents = Gauge("hybrid_index_documents", "documents in each served collection", ["collection"], registry=self.registry)
        self.collection_bytes = Gauge(
            "hybrid_collection_memory_bytes",
            "bytes each served collection holds in memory or maps (its arrays and index files)",
            ["collection"],
            registry=self.registry,
        )
        self.failed_collections = Gauge(
            "hybrid_collections_failed",
            "collections of the data directory that cannot be opened (GET /collections says which and why); the others serve",
            registry=self.registry,
        )
        self.query_cache = Counter(
            "hybrid_query_cache_lookups", "query embedding cache lookups by result", ["result"], registry=self.registry
        )
        self.query_cache_hit_ratio = Gauge(
            "hybrid_query_cache_hit_ratio", "query embedding cache hits / lookups since start (read from the cache)", registry=self.registry
        )
        self.snapshot_time = Gauge(
            "hybrid_snapshot_last_timestamp_seconds",
            "when the newest snapshot of each collection was taken (unix time)",
            ["collection"],
            registry=self.registry,
        )
        self.snapshot_bytes = Gauge(
            "hybrid_snapshot_last_bytes", "the size of the newest snapshot of each collection", ["collection"], registry=self.registry
        )
        self.build_info = Gauge(
            "hybrid_index_info",
            "each served collection's index (value 1)",
            ["collection", "format_version", "builder_version", "model", "faiss", "created_at"],
            registry=self.registry,
        )

    def observe_query_cache(self, hits: int, misses: int) -> None:
        self.query_cache.labels("hit").inc(hits)
        self.query_cache.labels("miss").inc(misses)

    def observe_search(self, timings_ms: dict[str, float]) -> None:
        for stage, ms in timings_ms.items():
            self.stage_seconds.labels(stage).observe(ms / 1000)

    def describe_index(self, collection: str, manifest: Manifest, documents: int) -> None:
        self.documents.labels(collection).set(documents)
        self.forget_labels(self.build_info, collection)
        self.build_info.labels(
            collection, str(FORMAT_VERSION), manifest.builder_version, manifest.embedder.model, manifest.faiss.factory, manifest.created_at
        ).set(1)

    def describe_snapshots(self, infos) -> None:
        """The newest of each collection's snapshots (SnapshotInfo, oldest first): its time and size."""
        for gauge in (self.snapshot_time, self.snapshot_bytes):
            gauge.clear()
        for info in infos:
            self.snapshot_time.labels(info.collection).set(datetime.fromisoformat(info.created_at).timestamp())
            self.snapshot_bytes.labels(info.collection).set(info.bytes)

    def forget(self, collection: str) -> None:
        """A dropped collection leaves the metrics."""
        for gauge in (self.documents, self.collection_bytes, self.build_info):
            self.forget_labels(gauge, collection)

    @staticmethod
    def forget_labels(gauge: Gauge, collection: str) -> None:
        for labels in [key for key in list(gauge._metrics) if key[0] == collection]:
            gauge.remove(*labels)


class RequestContext:
    """ASGI middleware: a request id (from X-Request-ID when sane, else new) on the response, in every
    log line of the request, and one JSON access-log line with status and duration."""

    def __init__(self, app: ASGIApp, metrics: Metrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        incoming = dict(scope.get("headers") or []).get(b"x-request-id", b"").decode("latin-1")
        request_id = incoming if _SAFE_ID.match(incoming) else uuid.uuid4().hex
        token = request_id_var.set(request_id)
        started, status = time.perf_counter(), 500

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message = {**message, "headers": [*message.get("headers", []), (b"x-request-id", request_id.encode())]}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            route = scope.get("route")
            path = getattr(route, "path", None) or "unmatched"  # route templates only: bounded label values
            self.metrics.requests.labels(path, str(status)).inc()
            logger.info(
                "request",
                extra={
                    "method": scope["method"],
                    "path": scope["path"],
                    "status": status,
                    "ms": round((time.perf_counter() - started) * 1000, 3),
                },
            )
            request_id_var.reset(token)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, request id, and any `extra` fields."""

    _standard = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "color_message"}  # uvicorn's ANSI twin

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
            "request_id": request_id_var.get(),
        }
        entry.update({k: v for k, v in vars(record).items() if k not in self._standard})
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)
