"""Sharded serving on Ray Serve: one deployment per shard (each with R replicas) and an ingress deployment that runs
the service's own FastAPI app (app.main.create_app) with a coordinator whose shards answer through deployment handles
(indexer.shards.coordinator.ShardedIndex, search.sharded). Keys, metrics, the playground and every route are the app's.

Writes: each shard also has a writer deployment of one replica, which logs and applies the shard's writes
(indexer.shards.writes.ShardedCollection routes each document to its shard); the search replicas follow the writer's log,
catching up before they answer a search that carries a newer sequence number than they hold (and reopening the
folder after the writer compacted it).

Hot reload: POST /admin/reload (or a restart of the ingress) reopens the sharded index's folder; every call to a
shard carries the checksum of the shards.json the coordinator opened, and a replica holding another split reopens
its shard folder before it answers, so replicas follow a re-split without being redeployed.

The shard folders must be readable (and, for the writers, writable) at the same path by every node: shared storage.

Start-up: Ray gives its HTTP proxy a fixed 60 s to come up, which a busy machine can miss; past that, `run` keeps
waiting on Serve's own status until the proxy is healthy and the application runs, up to $HYBRID_RAY_START_TIMEOUT
seconds (default 600) in all.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import math
import os
import signal
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

from hybrid_retrieval.cluster import connect, require_ray
from hybrid_retrieval.common.errors import ConfigError
from hybrid_retrieval.indexer.shards.coordinator import ShardedIndex
from hybrid_retrieval.indexer.shards.layout import SHARDS_FILE, read_shards
from hybrid_retrieval.indexer.shards.open import open_shard
from hybrid_retrieval.indexer.shards.shard import ShardSearcher
from hybrid_retrieval.indexer.shards.wire import ShardDescription, ShardStats
from hybrid_retrieval.search.segments import CorpusStatistics
from hybrid_retrieval.search.sharded import FieldColumns, Leg, MinSeq, ShardCandidates, ShardRanking, ShardSearchRequest, ShardTop1
from hybrid_retrieval.search.typo import TypoTerms

if TYPE_CHECKING:  # Ray is an optional extra, imported when serving
    from fastapi import FastAPI
    from ray.serve import Application
    from ray.serve.handle import DeploymentHandle

    from hybrid_retrieval.app.settings import Settings

logger = logging.getLogger(__name__)

APP_NAME = "hybrid"
START_TIMEOUT_VARIABLE = "HYBRID_RAY_START_TIMEOUT"
DEFAULT_START_TIMEOUT_S = 600.0


def start_timeout() -> float:
    """Seconds `run` waits for the proxy and the application to come up: $HYBRID_RAY_START_TIMEOUT, default 600."""
    value = os.environ.get(START_TIMEOUT_VARIABLE, "").strip()
    try:
        seconds = float(value) if value else DEFAULT_START_TIMEOUT_S
    except ValueError:
        seconds = math.nan
    if not 0 < seconds < math.inf:
        raise ConfigError(f"{START_TIMEOUT_VARIABLE} must be a number of seconds > 0, got {value!r}")
    return seconds


def shard_version(folder: Path) -> str:
    """What a replica and its coordinator compare: the split the shard belongs to (the checksum of shards.json, which
    a re-split rewrites and a shard's compaction does not) and the shard's folder."""
    folder = Path(folder)
    return hashlib.sha256((folder.parent / SHARDS_FILE).read_bytes()).hexdigest() + ":" + folder.name


def deployment_name(i: int, role: str = "") -> str:
    return f"shard-{i:03d}{'-' + role if role else ''}"


class ShardReplica:
    """A Serve replica of one shard: a ShardSearcher over its folder, reopened when a call names another split. The
    shard's writer is a deployment of one replica; the search replicas follow its log (indexer.live.collection.Collection.follow)
    up to the sequence number each search carries.

    Its methods are indexer.shards.wire.ShardWriter's, each first given the split the coordinator opened."""

    def __init__(self, folder: str, verify: str = "full", device: str = "auto"):
        self.folder, self.verify, self.device = Path(folder), verify, device
        self._lock = threading.Lock()
        self._open()

    def _open(self) -> None:
        version = shard_version(self.folder)
        self.searcher = open_shard(self.folder, verify=self.verify, device=self.device)
        self.version = version

    def _at(self, version: str) -> ShardSearcher:
        if version != self.version:
            with self._lock:
                if version != self.version:
                    previous = self.searcher
                    self._open()
                    logger.info("shard %s reopened at version %s", self.folder, self.version[:12])
                    previous.close()
            if version != self.version:
                raise RuntimeError(
                    f"shard {self.folder} is at version {self.version[:12]}, the coordinator asked for "
                    f"{version[:12]}: the folder changed again; reload"
                )
        return self.searcher

    def describe(self, version: str) -> ShardDescription:
        return self._at(version).describe()

    def search(self, version: str, leg: Leg, request: ShardSearchRequest) -> ShardRanking:
        return self._at(version).search(leg, request)

    def candidates(self, version: str, request: ShardSearchRequest) -> ShardCandidates:
        return self._at(version).candidates(request)

    def statistics(self, version: str, terms: list[str], min_seq: MinSeq) -> CorpusStatistics:
        return self._at(version).statistics(terms, min_seq)

    def raw_top1(self, version: str, vector: np.ndarray) -> ShardTop1 | None:
        return self._at(version).raw_top1(vector)

    def documents(self, version: str, positions: np.ndarray, min_seq: MinSeq) -> list[dict[str, Any] | None]:
        return self._at(version).documents(positions, min_seq)

    def document_by_id(self, version: str, doc_id: str) -> dict[str, Any] | None:
        return self._at(version).document_by_id(doc_id)

    def facet_counts(self, version: str, names: list[str], positions: np.ndarray, min_seq: MinSeq) -> dict[str, list[tuple[Any, int]]]:
        return self._at(version).facet_counts(names, positions, min_seq)

    def typo_terms(self, version: str, query: str, typo: str | int, min_seq: MinSeq) -> TypoTerms:
        return self._at(version).typo_terms(query, typo, min_seq)

    def positions_of(self, version: str, ids: list[str], min_seq: MinSeq) -> list[int | None]:
        return self._at(version).positions_of(ids, min_seq)

    def admits(self, version: str, filter_: dict[str, Any], positions: np.ndarray, min_seq: MinSeq) -> np.ndarray:
        return self._at(version).admits(filter_, positions, min_seq)

    def field_columns(self, version: str, positions: np.ndarray, min_seq: MinSeq) -> FieldColumns:
        return self._at(version).field_columns(positions, min_seq)

    def upsert(self, version: str, documents: list[dict[str, Any]], positions: list[int]) -> int:
        return self._at(version).upsert(documents, positions)

    def delete(self, version: str, ids: list[str]) -> int:
        return self._at(version).delete(ids)

    def refresh(self, version: str) -> int:
        return self._at(version).refresh()

    def needs_compaction(self, version: str, fraction: float, min_docs: int) -> bool:
        return self._at(version).needs_compaction(fraction, min_docs)

    def compact(self, version: str) -> int:
        return self._at(version).compact()

    def stats(self, version: str) -> ShardStats:
        return self._at(version).stats()

    def field_types(self, version: str) -> dict[str, str | None]:
        return self._at(version).field_types()


class RemoteShard:
    """A shard's client (indexer.shards.wire.ShardWriter) over a deployment handle of ShardReplica, pinned to the
    split the coordinator opened."""

    def __init__(self, handle: DeploymentHandle, version: str):
        self.handle, self.version = handle, version

    def _call(self, method: DeploymentHandle, *args: object) -> Any:
        """`method` (a method of the handle's ShardReplica) at this split, and its answer."""
        return method.remote(self.version, *args).result()

    def describe(self) -> ShardDescription:
        return self._call(self.handle.describe)

    def search(self, leg: Leg, request: ShardSearchRequest) -> ShardRanking:
        return self._call(self.handle.search, leg, request)

    def candidates(self, request: ShardSearchRequest) -> ShardCandidates:
        return self._call(self.handle.candidates, request)

    def statistics(self, terms: list[str], min_seq: MinSeq = ()) -> CorpusStatistics:
        return self._call(self.handle.statistics, terms, min_seq)

    def raw_top1(self, vector: np.ndarray) -> ShardTop1 | None:
        return self._call(self.handle.raw_top1, vector)

    def documents(self, positions: np.ndarray, min_seq: MinSeq = ()) -> list[dict[str, Any] | None]:
        return self._call(self.handle.documents, positions, min_seq)

    def document_by_id(self, doc_id: str) -> dict[str, Any] | None:
        return self._call(self.handle.document_by_id, doc_id)

    def facet_counts(self, names: list[str], positions: np.ndarray, min_seq: MinSeq = ()) -> dict[str, list[tuple[Any, int]]]:
        return self._call(self.handle.facet_counts, names, positions, min_seq)

    def field_columns(self, positions: np.ndarray, min_seq: MinSeq = ()) -> FieldColumns:
        return self._call(self.handle.field_columns, positions, min_seq)

    def positions_of(self, ids: list[str], min_seq: MinSeq = ()) -> list[int | None]:
        return self._call(self.handle.positions_of, ids, min_seq)

    def typo_terms(self, query: str, typo: str | int, min_seq: MinSeq = ()) -> TypoTerms:
        return self._call(self.handle.typo_terms, query, typo, min_seq)

    def admits(self, filter_: dict[str, Any], positions: np.ndarray, min_seq: MinSeq = ()) -> np.ndarray:
        return self._call(self.handle.admits, filter_, positions, min_seq)

    def upsert(self, documents: list[dict[str, Any]], positions: list[int]) -> int:
        return self._call(self.handle.upsert, documents, positions)

    def delete(self, ids: list[str]) -> int:
        return self._call(self.handle.delete, ids)

    def refresh(self) -> int:
        return self._call(self.handle.refresh)

    def needs_compaction(self, fraction: float, min_docs: int) -> bool:
        return self._call(self.handle.needs_compaction, fraction, min_docs)

    def compact(self) -> int:
        return self._call(self.handle.compact)

    def stats(self) -> ShardStats:
        return self._call(self.handle.stats)

    def field_types(self) -> dict[str, str | None]:
        return self._call(self.handle.field_types)


def open_remote(
    folder: Path,
    handles: list[DeploymentHandle],
    writer_handles: list[DeploymentHandle] | None = None,
    device: str = "auto",
    query_precision: str = "auto",
    verify: str = "full",
) -> ShardedIndex:
    """The coordinator's view of the sharded index at `folder`, its shards answering through `handles` and taking
    writes through `writer_handles`."""
    info = read_shards(folder)
    if len(handles) != len(info["shards"]):
        raise ConfigError(
            f"{folder} now has {len(info['shards'])} shards and {len(handles)} shard deployments run: "
            "redeploy (`hybrid serve --ray` again) to change the number of shards"
        )
    versions = [shard_version(Path(folder) / shard["folder"]) for shard in info["shards"]]
    clients = [RemoteShard(handle, version) for handle, version in zip(handles, versions)]
    writers = [RemoteShard(handle, version) for handle, version in zip(writer_handles, versions)] if writer_handles else None
    return ShardedIndex(folder, clients, device, query_precision, verify=verify, writers=writers)


def application(settings: Settings, replicas: int = 1, replica_cpus: float = 0.0) -> Application:
    """The Serve application: the shard deployments and the ingress that wraps the service's FastAPI app."""
    require_ray()
    from ray import serve

    from hybrid_retrieval.app.main import create_app

    if replicas < 1:
        raise ConfigError(f"--replicas must be >= 1, got {replicas}")
    assert settings.index is not None  # main and serve_index name one
    folder = Path(settings.index).resolve()
    info = read_shards(folder)
    actor = {"num_cpus": replica_cpus}
    shards = [
        serve.deployment(name=deployment_name(i, role), num_replicas=copies, ray_actor_options=actor)(ShardReplica).bind(
            str(folder / shard["folder"]), settings.verify, settings.device
        )
        for role, copies in (("", replicas), ("writer", 1))  # the writer: one replica, whose log the others follow
        for i, shard in enumerate(info["shards"])
    ]
    count = len(info["shards"])
    settings = settings.model_copy(update={"index": folder})

    def build_app() -> FastAPI:  # evaluated in the ingress replica: the handles and the coordinator live there
        def opener() -> ShardedIndex:
            handles = {
                role: [serve.get_deployment_handle(deployment_name(i, role), app_name=APP_NAME) for i in range(count)]
                for role in ("", "writer")
            }
            return open_remote(folder, handles[""], handles["writer"], settings.device, settings.query_precision, settings.verify)

        return create_app(settings, opener=opener)

    class Ingress:
        def __init__(self, *shard_handles: Application):
            self.shards = shard_handles  # bound so that Serve deploys the shards with the ingress

    ingress = serve.deployment(name="ingress", ray_actor_options=actor)(serve.ingress(build_app)(Ingress))
    return ingress.bind(*shards)


def _stop_on_signals(stop: threading.Event) -> None:
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())


def _wait_until_up(serve: ModuleType, deadline: float, application: bool, missed: TimeoutError) -> None:
    """Poll Serve's status until every proxy is healthy (and, with `application`, the application runs); raise `missed`
    (Ray's own timeout) once `deadline` passes."""
    logger.warning(
        "%s Waiting up to %.0f s more for Ray Serve to come up (%s)", missed, max(0.0, deadline - time.monotonic()), START_TIMEOUT_VARIABLE
    )
    while True:
        status = serve.status()
        app = status.applications.get(APP_NAME)
        if app is not None and app.status == "DEPLOY_FAILED":
            raise RuntimeError(f"deploying {APP_NAME} on Ray Serve failed: {app.message}")
        if (
            status.proxies
            and all(proxy == "HEALTHY" for proxy in status.proxies.values())
            and (not application or (app is not None and app.status == "RUNNING"))
        ):
            return
        if time.monotonic() > deadline:
            raise missed
        time.sleep(1)


def run(
    settings: Settings, address: str | None, replicas: int, replica_cpus: float = 0.0, num_cpus: int | None = None, block: bool = True
) -> DeploymentHandle:
    """Deploy on the cluster at `address` (a local instance when None) and serve HTTP on the settings' host and port."""
    deadline = time.monotonic() + start_timeout()  # read first: a bad value fails before Ray starts
    connect(address, num_cpus)
    from ray import serve

    stop = threading.Event()
    if block:  # Ray's driver installs its own SIGTERM handler (exit status 15): ours replace it, before and after deploying
        _stop_on_signals(stop)
    try:
        serve.start(http_options={"host": settings.host, "port": settings.port}, proxy_location="HeadOnly")
    except TimeoutError as missed:  # the proxy missed Ray's fixed wait, but goes on starting
        _wait_until_up(serve, deadline, application=False, missed=missed)
    try:
        handle = serve.run(application(settings, replicas, replica_cpus), name=APP_NAME, route_prefix="/")
    except TimeoutError as missed:  # the same fixed wait, after the application is deployed
        _wait_until_up(serve, deadline, application=True, missed=missed)
        handle = serve.get_app_handle(APP_NAME)
    logger.info("serving %s on Ray Serve at http://%s:%d (%d replica(s) per shard)", settings.index, settings.host, settings.port, replicas)
    if block:
        _stop_on_signals(stop)
        stop.wait()
        serve.delete(APP_NAME)  # the application would outlive this process on a cluster it joined
        logger.info("stopped serving %s", settings.index)
    return handle


def serve_index(index: Path, host: str = "127.0.0.1", port: int = 8000, replicas: int = 1, **settings: Any) -> DeploymentHandle:
    """Deploy the sharded index at `index` on the connected Ray cluster without blocking (benchmarks, tests);
    `settings`: other service settings (app.settings.Settings fields)."""
    from hybrid_retrieval.app.settings import Settings

    return run(Settings(index=index, host=host, port=port, **settings), None, replicas, block=False)


def main(argv: list[str] | None = None) -> int:
    """`hybrid serve --ray [ADDRESS] --replicas R ...` (the other flags are `hybrid serve`'s)."""
    from hybrid_retrieval.app.__main__ import parse_settings

    parser = argparse.ArgumentParser(prog="hybrid serve --ray", description="serve a sharded index on Ray Serve")
    parser.add_argument(
        "--ray", nargs="?", const="", metavar="ADDRESS", help="Ray cluster address (e.g. 127.0.0.1:6379); none: start a local Ray instance"
    )
    parser.add_argument("--replicas", type=int, default=1, help="replicas of each shard's deployment")
    parser.add_argument("--replica-cpus", type=float, default=0.0, help="CPUs Ray reserves for each replica (default 0)")
    settings, args = parse_settings(argv, parser)
    if settings.index is None:
        parser.exit(2, "error: --ray serves a sharded index: pass --index DIR or set HYBRID_INDEX\n")
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    run(settings, args.ray or None, args.replicas, args.replica_cpus)
    return 0
