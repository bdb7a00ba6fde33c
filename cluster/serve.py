"""Sharded serving on Ray Serve: one deployment per shard (each with R replicas) and an ingress deployment that runs
the service's own FastAPI app (app.main.create_app) with a coordinator whose shards answer through deployment handles
(indexer.shards.ShardedIndex, search.sharded). Keys, metrics, the playground and every route are the app's.

Hot reload: POST /admin/reload (or a restart of the ingress) reopens the sharded index's folder; every call to a
shard carries the checksum of the shard manifest the coordinator opened, and a replica holding another version
reopens its shard folder before it answers, so replicas follow a re-split without being redeployed. Writes are
refused (a sharded index is read-only: indexer.shards.ShardedIndex.read_only_reason).

The shard folders must be readable at the same path by every node (shared storage, or the same copy on each).
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import signal
import threading
from pathlib import Path

from cluster import connect, require_ray
from indexer.manifest import MANIFEST
from indexer.shards import ShardedIndex, ShardSearcher, read_shards
from indexer.store import open_index
from search.errors import ConfigError

logger = logging.getLogger(__name__)

APP_NAME = "hybrid"


def shard_version(folder: Path) -> str:
    """What a replica and its coordinator compare: the checksum of the shard's manifest (it lists every file's)."""
    return hashlib.sha256((Path(folder) / MANIFEST).read_bytes()).hexdigest()


def deployment_name(i: int) -> str:
    return f"shard-{i:03d}"


class ShardReplica:
    """A Serve replica of one shard: a ShardSearcher over its folder, reopened when a call names another version."""

    def __init__(self, folder: str, verify: str = "full", device: str = "auto"):
        self.folder, self.verify, self.device = Path(folder), verify, device
        self._lock = threading.Lock()
        self._open()

    def _open(self) -> None:
        version = shard_version(self.folder)
        self.searcher = ShardSearcher(open_index(self.folder, verify=self.verify, device=self.device, query_precision="fp32"))
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
                raise RuntimeError(f"shard {self.folder} is at version {self.version[:12]}, the coordinator asked for "
                                   f"{version[:12]}: the folder changed again; reload")
        return self.searcher

    def describe(self, version: str) -> dict:
        return self._at(version).describe()

    def search(self, version: str, request: dict) -> dict:
        return self._at(version).search(request)

    def raw_top1(self, version: str, vector):
        return self._at(version).raw_top1(vector)

    def documents(self, version: str, positions) -> list[dict]:
        return self._at(version).documents(positions)

    def document_by_id(self, version: str, doc_id: str):
        return self._at(version).document_by_id(doc_id)

    def facet_counts(self, version: str, names, positions):
        return self._at(version).facet_counts(names, positions)


class RemoteShard:
    """search.sharded.ShardClient over a Serve deployment handle, pinned to the shard version the coordinator opened."""

    def __init__(self, handle, version: str):
        self.handle, self.version = handle, version

    def _call(self, method: str, *args):
        return getattr(self.handle, method).remote(self.version, *args).result()

    def describe(self):
        return self._call("describe")

    def search(self, request):
        return self._call("search", request)

    def raw_top1(self, vector):
        return self._call("raw_top1", vector)

    def documents(self, positions):
        return self._call("documents", positions)

    def document_by_id(self, doc_id):
        return self._call("document_by_id", doc_id)

    def facet_counts(self, names, positions):
        return self._call("facet_counts", names, positions)


def open_remote(folder: Path, handles: list, device: str = "auto", query_precision: str = "auto",
                verify: str = "full") -> ShardedIndex:
    """The coordinator's view of the sharded index at `folder`, its shards answering through `handles`."""
    info = read_shards(folder)
    if len(handles) != len(info["shards"]):
        raise ConfigError(f"{folder} now has {len(info['shards'])} shards and {len(handles)} shard deployments run: "
                          "redeploy (`hybrid serve --ray` again) to change the number of shards")
    clients = [RemoteShard(handle, shard_version(Path(folder) / shard["folder"])) for handle, shard in zip(handles, info["shards"])]
    return ShardedIndex(folder, clients, device, query_precision, verify=verify)


def application(settings, replicas: int = 1, replica_cpus: float = 0.0):
    """The Serve application: the shard deployments and the ingress that wraps the service's FastAPI app."""
    require_ray()
    from ray import serve

    from app.main import create_app

    if replicas < 1:
        raise ConfigError(f"--replicas must be >= 1, got {replicas}")
    folder = Path(settings.index).resolve()
    info = read_shards(folder)
    shard_options = {"num_replicas": replicas, "ray_actor_options": {"num_cpus": replica_cpus}}
    shards = [serve.deployment(ShardReplica, name=deployment_name(i), **shard_options).bind(
                  str(folder / shard["folder"]), settings.verify, settings.device)
              for i, shard in enumerate(info["shards"])]
    names = [deployment_name(i) for i in range(len(shards))]
    settings = settings.model_copy(update={"index": folder})

    def build_app():  # evaluated in the ingress replica: the handles and the coordinator live there
        def opener():
            handles = [serve.get_deployment_handle(name, app_name=APP_NAME) for name in names]
            return open_remote(folder, handles, settings.device, settings.query_precision, settings.verify)
        return create_app(settings, opener=opener)

    class Ingress:
        def __init__(self, *shard_handles):
            self.shards = shard_handles  # bound so that Serve deploys the shards with the ingress

    ingress = serve.deployment(serve.ingress(build_app)(Ingress), name="ingress",
                               ray_actor_options={"num_cpus": replica_cpus})
    return ingress.bind(*shards)


def _stop_on_signals(stop: threading.Event) -> None:
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())


def run(settings, address: str | None, replicas: int, replica_cpus: float = 0.0, num_cpus: int | None = None,
        block: bool = True):
    """Deploy on the cluster at `address` (a local instance when None) and serve HTTP on the settings' host and port."""
    connect(address, num_cpus)
    from ray import serve

    stop = threading.Event()
    if block:  # Ray's driver installs its own SIGTERM handler (exit status 15): ours replace it, before and after deploying
        _stop_on_signals(stop)
    serve.start(http_options={"host": settings.host, "port": settings.port}, proxy_location="HeadOnly")
    handle = serve.run(application(settings, replicas, replica_cpus), name=APP_NAME, route_prefix="/")
    logger.info("serving %s on Ray Serve at http://%s:%d (%d replica(s) per shard)", settings.index, settings.host,
                settings.port, replicas)
    if block:
        _stop_on_signals(stop)
        stop.wait()
        serve.delete(APP_NAME)  # the application would outlive this process on a cluster it joined
        logger.info("stopped serving %s", settings.index)
    return handle


def serve_index(index: Path, host: str = "127.0.0.1", port: int = 8000, replicas: int = 1, **settings):
    """Deploy the sharded index at `index` on the connected Ray cluster without blocking (benchmarks, tests);
    `settings`: other service settings (app.settings.Settings fields)."""
    from app.settings import Settings

    return run(Settings(index=index, host=host, port=port, **settings), None, replicas, block=False)


def main(argv: list[str] | None = None) -> int:
    """`hybrid serve --ray [ADDRESS] --replicas R ...` (the other flags are `hybrid serve`'s)."""
    from app.__main__ import parse_settings

    parser = argparse.ArgumentParser(prog="hybrid serve --ray", description="serve a sharded index on Ray Serve")
    parser.add_argument("--ray", nargs="?", const="", metavar="ADDRESS",
                        help="Ray cluster address (e.g. 127.0.0.1:6379); none: start a local Ray instance")
    parser.add_argument("--replicas", type=int, default=1, help="replicas of each shard's deployment")
    parser.add_argument("--replica-cpus", type=float, default=0.0, help="CPUs Ray reserves for each replica (default 0)")
    settings, args = parse_settings(argv, parser)
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    run(settings, args.ray or None, args.replicas, args.replica_cpus)
    return 0
