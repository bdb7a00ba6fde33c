"""API keys and the in-flight request limit, as FastAPI dependencies."""

from __future__ import annotations

import hmac
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from fastapi import Depends, HTTPException, Request

from hybrid_retrieval.app.settings import Settings
from hybrid_retrieval.common.errors import ConfigError

READ, WRITE = "read", "write"


@dataclass(frozen=True)
class Grant:
    """What a key may do: its role (a write key also reads) and the collections it may use (None: every one). A
    collection may be named directly or through an alias: either name in the scope allows it."""

    role: str
    scope: frozenset[str] | None = None

    def allows(self, *names: str) -> bool:
        return self.scope is None or any(name in self.scope for name in names)


OPEN = Grant(READ)  # no key configured at all: anyone may search


class Keys:
    """The configured keys with their grants. A key file's line is `KEY [ROLE] [SCOPE]`: ROLE `read` or `write` (default:
    the file's role), SCOPE comma-separated collection and alias names (default: all). Comma-separated keys in
    HYBRID_API_KEYS / HYBRID_WRITE_KEYS have their variable's role and every collection. Lines starting with # are
    comments."""

    def __init__(self, entries: list[tuple[bytes, Grant]], metrics_key: bytes | None = None):
        self.entries, self.metrics_key = entries, metrics_key

    @classmethod
    def load(cls, settings: Settings) -> Keys:
        entries = [
            *_entries(settings.api_keys, settings.api_keys_file, READ),
            *_entries(settings.write_keys, settings.write_keys_file, WRITE),
        ]
        metrics_key = settings.metrics_key.get_secret_value().strip().encode() if settings.metrics_key is not None else b""
        return cls(entries, metrics_key or None)

    def sees_all_metrics(self, presented: str | None) -> bool:
        """Whether `presented` is HYBRID_METRICS_KEY (a scraper's key: every series of /metrics, nothing else)."""
        return self.metrics_key is not None and presented is not None and hmac.compare_digest(presented.encode(), self.metrics_key)

    @property
    def any(self) -> bool:
        return bool(self.entries)

    @property
    def writes(self) -> bool:
        return any(grant.role == WRITE for _, grant in self.entries)

    def match(self, presented: bytes) -> Grant | None:
        """The grant of the presented key; every configured key is compared in constant time, and all of them: timing
        must not reveal which key, or how much of one, matched."""
        found = None
        for key, grant in self.entries:
            if hmac.compare_digest(presented, key):
                found = grant
        return found


def _entries(listed: str | None, file: Path | None, role: str) -> list[tuple[bytes, Grant]]:
    entries = [(k.strip().encode(), Grant(role)) for k in (listed or "").split(",") if k.strip()]
    if file:
        for number, line in enumerate(Path(file).read_text().splitlines(), start=1):
            fields = line.split()
            if not fields or fields[0].startswith("#"):
                continue
            grant_role, rest = (fields[1], fields[2:]) if len(fields) > 1 and fields[1] in (READ, WRITE) else (role, fields[1:])
            if len(rest) > 1:
                raise ConfigError(f"{file}:{number}: expected `KEY [read|write] [NAME,NAME,...]`, got {len(fields)} fields")
            scope = None if not rest or rest[0] == "*" else frozenset(name for name in rest[0].split(",") if name)
            entries.append((fields[0].encode(), Grant(grant_role, scope)))
    return entries


def presented_key(request: Request) -> str | None:
    auth = request.headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    return request.headers.get("x-api-key", "").strip() or None  # trimmed like the bearer token


# The dependencies are coroutines: they never block, and FastAPI runs a plain function in a worker thread (a thread
# hop per dependency per request, measurable at a few hundred requests a second). Each leaves the key's grant in
# request.state.grant, which the collection a route acts on is checked against (check_scope).


async def require_api_key(request: Request) -> None:
    """Reads: open when no key of either role is configured; else 401 without a key, 403 with a wrong one."""
    keys: Keys = request.app.state.keys
    request.state.grant = _check_key(request, keys) if keys.any else OPEN


async def require_write_key(request: Request) -> None:
    """Writes and admin endpoints: refused (403) unless write keys are configured and one is presented."""
    keys: Keys = request.app.state.keys
    if not keys.writes:
        raise HTTPException(
            status_code=403,
            detail="writes and admin endpoints are disabled: configure HYBRID_WRITE_KEYS (or HYBRID_WRITE_KEYS_FILE) to enable them",
        )
    grant = _check_key(request, keys)
    if grant.role != WRITE:
        raise HTTPException(status_code=403, detail="invalid API key for this endpoint: it is a read key")
    request.state.grant = grant


async def require_unscoped_write_key(request: Request) -> None:
    """What acts on every collection (reload): a write key for all of them."""
    await require_write_key(request)
    if request.state.grant.scope is not None:
        raise HTTPException(status_code=403, detail="this key is limited to some collections: this endpoint acts on all of them")


# The roles, as the routers' dependencies: each router holds the routes of one role.
READ_KEY = Depends(require_api_key)
WRITE_KEY = Depends(require_write_key)
ADMIN_KEY = Depends(require_unscoped_write_key)


def check_scope(request: Request, *names: str) -> None:
    """403 naming the collection when the request's key may not use it (by any of `names`: as asked, as resolved)."""
    grant: Grant | None = getattr(request.state, "grant", None)
    if grant is not None and not grant.allows(*names):
        raise HTTPException(status_code=403, detail=f"this key may not use collection {names[0]!r}")


def presented_grant(request: Request) -> Grant | None:
    """For routes that need no key but say more to one (/ready, /metrics): the grant of the key presented, OPEN when
    the service has no keys, None without a valid key."""
    keys: Keys = request.app.state.keys
    if not keys.any:
        return OPEN
    presented = presented_key(request)
    return keys.match(presented.encode()) if presented else None


def allowed(request: Request, *names: str) -> bool:
    grant: Grant | None = getattr(request.state, "grant", None)
    return grant is None or grant.allows(*names)


def _check_key(request: Request, keys: Keys) -> Grant:
    """401 without a key, 403 with a wrong one."""
    presented = presented_key(request)
    if not presented:
        raise HTTPException(
            status_code=401,
            detail="missing API key: send 'Authorization: Bearer <key>' or 'X-API-Key'",
            headers={"WWW-Authenticate": "Bearer"},
        )
    grant = keys.match(presented.encode())
    if grant is None:
        raise HTTPException(status_code=403, detail="invalid API key for this endpoint")
    return grant


class InFlightLimit:
    """At most `limit` searches at once; beyond that answer 503 + Retry-After instead of queueing without bound."""

    def __init__(self, limit: int):
        self.limit = limit
        self._slots = threading.BoundedSemaphore(limit)
        self._count_lock = threading.Lock()
        self.active = 0  # searches in flight now (writes yield cores to them: indexer.live.collection.Collection)

    @contextmanager
    def slot(self) -> Iterator[None]:
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
