"""API keys and the in-flight request limit, as FastAPI dependencies."""

from __future__ import annotations

import hmac
import threading
from contextlib import contextmanager
from pathlib import Path

from fastapi import HTTPException, Request

from hybrid_retrieval.app.settings import Settings


def load_api_keys(settings: Settings) -> tuple[bytes, ...]:
    """Read keys from HYBRID_API_KEYS (comma-separated) and HYBRID_API_KEYS_FILE (one per line)."""
    return _keys(settings.api_keys, settings.api_keys_file)


def load_write_keys(settings: Settings) -> tuple[bytes, ...]:
    """Write keys from HYBRID_WRITE_KEYS and HYBRID_WRITE_KEYS_FILE: they may also search."""
    return _keys(settings.write_keys, settings.write_keys_file)


def _keys(listed: str | None, file: Path | None) -> tuple[bytes, ...]:
    keys = [k.strip() for k in (listed or "").split(",")]
    if file:
        keys += [line.strip() for line in Path(file).read_text().splitlines()]
    return tuple(k.encode() for k in keys if k)


def _presented_key(request: Request) -> str | None:
    auth = request.headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    return request.headers.get("x-api-key", "").strip() or None  # trimmed like the bearer token


# The dependencies are coroutines: they never block, and FastAPI runs a plain function in a worker thread (a thread
# hop per dependency per request, measurable at a few hundred requests a second).


async def require_api_key(request: Request) -> None:
    """Searches: open when no key of either role is configured; else 401 without a key, 403 with a wrong one."""
    keys: tuple[bytes, ...] = request.app.state.api_keys + request.app.state.write_keys
    if keys:
        _check_key(request, keys)


async def require_write_key(request: Request) -> None:
    """Writes and admin endpoints: refused (403) unless write keys are configured and one is presented."""
    keys: tuple[bytes, ...] = request.app.state.write_keys
    if not keys:
        raise HTTPException(
            status_code=403,
            detail="writes and admin endpoints are disabled: configure HYBRID_WRITE_KEYS (or HYBRID_WRITE_KEYS_FILE) to enable them",
        )
    _check_key(request, keys)


def _check_key(request: Request, keys: tuple[bytes, ...]) -> None:
    """401 without a key, 403 with a wrong one; every configured key is compared in constant time."""
    presented = _presented_key(request)
    if not presented:
        raise HTTPException(
            status_code=401,
            detail="missing API key: send 'Authorization: Bearer <key>' or 'X-API-Key'",
            headers={"WWW-Authenticate": "Bearer"},
        )
    candidate = presented.encode()
    matched = False
    for key in keys:  # no early exit: timing must not reveal which key, or how much of one, matched
        matched |= hmac.compare_digest(candidate, key)
    if not matched:
        raise HTTPException(status_code=403, detail="invalid API key for this endpoint")


class InFlightLimit:
    """At most `limit` searches at once; beyond that answer 503 + Retry-After instead of queueing without bound."""

    def __init__(self, limit: int):
        self.limit = limit
        self._slots = threading.BoundedSemaphore(limit)
        self._count_lock = threading.Lock()
        self.active = 0  # searches in flight now (writes yield cores to them: indexer.live.collection.Collection)

    @contextmanager
    def slot(self):
        """Hold a slot for the request's lifetime, or refuse at once (never waits: callable on the event loop)."""
        if not self._slots.acquire(blocking=False):
            raise HTTPException(status_code=503, detail=f"server busy: {self.limit} searches in flight", headers={"Retry-After": "1"})
        with self._count_lock:
            self.active += 1
        try:
            yield
        finally:
            with self._count_lock:
                self.active -= 1
            self._slots.release()
