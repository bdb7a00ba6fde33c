"""Closed-loop HTTP load from one asyncio process: N keep-alive connections, each sending its next request as soon as
the previous answer has been read.

Lean on purpose: on a small machine the load generator shares the cores with the server it measures, and every
millisecond of client CPU is one the server does not get (this client spends 0.1-0.2 ms of CPU per request).
"""

from __future__ import annotations

import asyncio
import time
from urllib.parse import urlsplit

from bench.harness import percentiles


def post_request(host: str, path: str, body: bytes, headers: dict[str, str] | None = None) -> bytes:
    """One HTTP/1.1 POST of a JSON body on a kept-alive connection, as raw bytes."""
    lines = [
        f"POST {path} HTTP/1.1",
        f"Host: {host}",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
        *(f"{name}: {value}" for name, value in (headers or {}).items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


async def read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """Status and body of one response (Content-Length framing, which every answer of the service has)."""
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return status, await reader.readexactly(int(value))
    raise ValueError(f"response without Content-Length (status {status})")


async def _closed_loop(url: str, requests: list[bytes], clients: int, max_requests: int, seconds: float) -> dict:
    parts = urlsplit(url)
    connect = lambda: asyncio.open_connection(parts.hostname, parts.port)
    connections = [await connect() for _ in range(clients)]  # opened before the clock starts
    tickets = iter(range(max_requests))  # shared: the level stops after max_requests in all
    latencies: list[float] = []
    errors = 0

    async def client(reader, writer):
        nonlocal errors
        for i in tickets:
            if time.monotonic() > deadline:
                break
            start = time.perf_counter()
            try:
                writer.write(requests[i % len(requests)])
                status, _ = await read_response(reader)
                ok = status == 200
            except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
                ok = False
                writer.close()
                reader, writer = await connect()
            latencies.append((time.perf_counter() - start) * 1000)
            errors += not ok
        writer.close()

    deadline = time.monotonic() + seconds
    started = time.perf_counter()
    await asyncio.gather(*(client(reader, writer) for reader, writer in connections))
    wall = time.perf_counter() - started
    return {"requests": len(latencies), "errors": errors, "throughput_rps": round(len(latencies) / wall, 1), **percentiles(latencies)}


def closed_loop(
    url: str,
    bodies: list[bytes],
    clients: int,
    max_requests: int,
    seconds: float,
    path: str = "/search",
    headers: dict[str, str] | None = None,
) -> dict:
    """`clients` connections POSTing `bodies` in turn to `url` + `path` until `max_requests` were answered or
    `seconds` passed: requests, errors (non-200 or broken connections), throughput and latency percentiles."""
    host = urlsplit(url).netloc
    requests = [post_request(host, path, body, headers) for body in bodies]
    return asyncio.run(_closed_loop(url, requests, clients, max_requests, seconds))
