"""`python -m hybrid_retrieval.app` (what `hybrid serve` runs): the HTTP service, configured by flags over HYBRID_* variables."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import uvicorn
from pydantic import ValidationError

from hybrid_retrieval.app.main import create_app
from hybrid_retrieval.app.observability import JsonFormatter
from hybrid_retrieval.app.settings import Settings
from hybrid_retrieval.common.devices import DEVICES
from hybrid_retrieval.common.errors import HybridError
from hybrid_retrieval.common.memory import limit_heap_growth
from hybrid_retrieval.engine.collections import check_data_dir
from hybrid_retrieval.engine.schema import VERIFY_MODES
from hybrid_retrieval.engine.serving import open_folder


def parse_settings(argv: list[str] | None = None, parser: argparse.ArgumentParser | None = None) -> tuple[Settings, argparse.Namespace]:
    """(Settings, parsed flags) of `hybrid serve`'s flags over HYBRID_* variables; prints why and exits 2 when invalid
    `parser` may carry more flags (cluster.serve's)."""
    parser = parser or argparse.ArgumentParser(prog="hybrid serve", description="serve POST /search over HTTP")
    parser.add_argument("--data", type=Path, help="data directory of collections (env HYBRID_DATA; default ./data without --index)")
    parser.add_argument("--index", type=Path, help="an index folder served as one more collection, the default one (env HYBRID_INDEX)")
    parser.add_argument("--default-collection", help="the collection or alias the unprefixed routes act on (env HYBRID_DEFAULT_COLLECTION)")
    parser.add_argument("--host", help="bind address (env HYBRID_HOST, default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port (env HYBRID_PORT, default 8000)")
    parser.add_argument("--device", choices=DEVICES)
    parser.add_argument("--verify", choices=VERIFY_MODES, help="index file check at startup (default full)")
    parser.add_argument("--log-format", choices=("json", "text"), default="json", help="log lines as JSON objects (default) or text")
    args = parser.parse_args(argv)
    overrides = {k: v for k, v in vars(args).items() if k in Settings.model_fields and v is not None}
    try:
        settings = Settings(**overrides)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'settings'}: {e['msg']}" for e in exc.errors())
        parser.exit(2, f"error: invalid settings: {problems}\n")
    return settings, args


def main(argv: list[str] | None = None) -> int:
    limit_heap_growth()  # before any thread starts
    settings, args = parse_settings(argv)
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:  # opened here, not in the app's lifespan, so a bad index fails with one line and exit code 2
        index = open_folder(settings.index, settings) if settings.index is not None else None
        if settings.data_dir is not None:
            check_data_dir(settings.data_dir)  # a damaged aliases file, too
    except HybridError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.log_format == "json":
        for handler in logging.getLogger().handlers:
            handler.setFormatter(JsonFormatter())
    # Our middleware writes one structured access line per request: uvicorn's own access log would double it.
    uvicorn.run(
        create_app(settings, index=index),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        access_log=False,
        log_config=None,
        http=settings.http,
        loop=settings.loop,
        timeout_graceful_shutdown=settings.graceful_shutdown,  # type: ignore[arg-type]  # seconds, a float too (asyncio.wait_for)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
