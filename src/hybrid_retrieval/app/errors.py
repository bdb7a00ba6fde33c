"""The service's answer to every error: each domain error (common.errors) as its HTTP status, from one table; a
request that fails validation as 422 naming the field; anything else a logged 500."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from hybrid_retrieval.app.json_body import located
from hybrid_retrieval.common.errors import (
    BadSnapshot,
    Conflict,
    DeadlineExceeded,
    NotFound,
    SnapshotNotFound,
    SpecError,
    StorageError,
    TooMany,
    Unavailable,
)

logger = logging.getLogger(__name__)

# An error as (status, the body's `detail`); `Any`: each entry takes the one class it is registered for.
Answer = Callable[[Any], tuple[int, Any]]


def _plain(status: int) -> Answer:
    """Answered with the message alone."""
    return lambda exc: (status, str(exc))


# Every domain error's answer; the most specific class wins (Unavailable is a NotFound).
ERRORS: dict[type[Exception], Answer] = {
    NotFound: _plain(404),
    SnapshotNotFound: _plain(404),
    Conflict: _plain(409),
    TooMany: _plain(409),
    Unavailable: _plain(503),
    SpecError: lambda exc: (422, located(exc)),
    BadSnapshot: lambda exc: (422, [{"loc": ["body"], "msg": str(exc), "type": "value_error"}]),
    # nothing was written: 507 when the disk is full, 503 when the folder cannot be written (stats say why)
    StorageError: lambda exc: (507 if exc.kind == StorageError.FULL else 503, str(exc)),
    DeadlineExceeded: lambda exc: (504, f"the request {exc}"),
}


def add_error_handlers(app: FastAPI) -> None:
    for kind, answer in ERRORS.items():
        app.add_exception_handler(kind, _handler(answer))
    app.exception_handler(RequestValidationError)(_invalid_request)
    app.add_exception_handler(Exception, _unexpected)


def _handler(answer: Answer) -> Callable[[Request, Exception], Awaitable[JSONResponse]]:
    async def handle(request: Request, exc: Exception) -> JSONResponse:
        status, detail = answer(exc)
        return JSONResponse(status_code=status, content={"detail": detail})

    return handle


async def _invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
    # Echo where and what, never the input: it may be huge, or NaN, which JSON cannot carry.
    detail = [{"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]} for e in exc.errors()]
    return JSONResponse(status_code=422, content={"detail": detail})


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    logger.exception("unhandled error on %s", request.url.path)
    return JSONResponse(status_code=500, content={"detail": "internal server error"})
