"""Run `hybrid serve` in a subprocess on a free loopback port, for benchmarks and tests."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def running_server(
    index_dir: Path | str | None,
    env: dict[str, str] | None = None,
    ready_timeout_s: float = 120.0,
    cwd: Path | str | None = None,
    module: str = "hybrid_retrieval.app",
    log: Path | None = None,
):
    """Yield (base url, process) once /ready answers 200; terminate the server on exit. `index_dir`: the --index folder
    (None: the data directory `env` names in HYBRID_DATA, or ./data in `cwd`). `cwd`: where the server runs;
    `module`: what `python -m` starts (another version of the service, found through `env`'s PYTHONPATH); `log`: a
    file its output is appended to (else it is discarded)."""
    import httpx  # a dev dependency: only benchmarks and tests start servers

    port = free_port()
    # Benchmarks repeat their queries: with the query cache on they would time the cache, not the model (a cache hit
    # has its own row), so it is off unless `env` turns it on.
    environment = {
        **os.environ,
        **({"HYBRID_INDEX": str(Path(index_dir).resolve())} if index_dir is not None else {}),
        "HYBRID_PORT": str(port),
        "HYBRID_HOST": "127.0.0.1",
        "HYBRID_LOG_LEVEL": "warning",
        "HYBRID_QUERY_CACHE_SIZE": "0",
        **(env or {}),
    }
    # the file is closed once the child started: it holds its own descriptor
    with log.open("ab") if log is not None else contextlib.nullcontext(subprocess.DEVNULL) as output:
        process = subprocess.Popen([sys.executable, "-m", module], env=environment, cwd=cwd, stdout=output, stderr=output)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + ready_timeout_s
        while True:
            try:
                if httpx.get(f"{url}/ready", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"server on {url} did not become ready (exit code {process.poll()})")
            time.sleep(0.2)
        yield url, process
    finally:
        process.terminate()
        process.wait(timeout=30)
