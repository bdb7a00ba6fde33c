"""ASGI middleware that rejects request bodies over a size limit with 413, before parsing."""

from __future__ import annotations

import json
import re

from fastapi import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

# document batches: /documents..., and /collections/{name}/documents...
WRITE_PATHS = re.compile(r"(/collections/[^/]+)?/documents(/|$)")
SNAPSHOT_UPLOADS = re.compile(r"/collections/[^/]+/snapshots/restore$")


class BodyTooLarge(HTTPException):
    """Raised while a body is read (a chunked body has no Content-Length to check first). An HTTPException, so that
    FastAPI's body parsing passes it on as the 413 it is instead of a 400."""

    def __init__(self, limit: int):
        super().__init__(413, f"request body exceeds {limit} bytes")
        self.limit = limit


class BodySizeLimit:
    """`max_bytes` for every body, `write_max_bytes` for the document routes (WRITE_PATHS), `upload_max_bytes` for
    snapshot uploads (SNAPSHOT_UPLOADS)."""

    def __init__(self, app: ASGIApp, max_bytes: int, write_max_bytes: int | None = None, upload_max_bytes: int | None = None):
        self.app, self.default_max = app, max_bytes
        self.write_max, self.upload_max = write_max_bytes or max_bytes, upload_max_bytes or max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        limit = self.write_max if WRITE_PATHS.match(path) else self.upload_max if SNAPSHOT_UPLOADS.match(path) else self.default_max
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            return await self._reject(send, limit)
        seen = 0

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise BodyTooLarge(limit)
            return message

        try:
            await self.app(scope, limited_receive, send)
        except BodyTooLarge:  # raised where no handler answered it (the body was read outside a route)
            await self._reject(send, limit)

    async def _reject(self, send: Send, limit: int) -> None:
        body = json.dumps({"detail": f"request body exceeds {limit} bytes"}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body})
