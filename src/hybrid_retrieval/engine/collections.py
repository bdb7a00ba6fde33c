"""The collections a service serves, by name, and the aliases that point at them.

A data directory (indexer.datadir) holds them: every collection there is served from startup, those created through
the API join at once, and those an offline `hybrid index --collection NAME --data DIR` publishes join within a refresh
interval. `hybrid serve --index FOLDER` serves one more collection from outside it, named after the folder. The
unprefixed routes act on the default collection (HYBRID_DEFAULT_COLLECTION, a name or an alias).

Lookups read `served` and `aliases` once; both are replaced whole when they change, so a request sees one state or the
next, never a half-swapped one.
"""

from __future__ import annotations

import functools
import logging
import threading
from pathlib import Path

from hybrid_retrieval.common.errors import Conflict, HybridError, NotFound, StorageError, TooMany, Unavailable
from hybrid_retrieval.common.names import name_of_folder
from hybrid_retrieval.engine.serving import Reloader, Resources, open_folder
from hybrid_retrieval.indexer.datadir.layout import DataDir
from hybrid_retrieval.indexer.datadir.settings import CollectionSettings
from hybrid_retrieval.indexer.datadir.snapshots import SnapshotInfo, SnapshotStore, model_folders, restore_into
from hybrid_retrieval.indexer.live.log import log_path
from hybrid_retrieval.indexer.live.view import ReadView
from hybrid_retrieval.indexer.manifest import MANIFEST, read_manifest
from hybrid_retrieval.indexer.shards.layout import is_sharded
from hybrid_retrieval.indexer.store import MODEL_DIR, folder_identity, model_identity
from hybrid_retrieval.models.embedder import NO_MODEL

logger = logging.getLogger(__name__)

DEFAULT_MAX_SNAPSHOT_BYTES = 64 * 1024**3  # the largest upload, and the most bytes of files a restore writes


def check_data_dir(root: Path) -> None:
    """Open the data directory at `root` as a service would (HybridError naming what is wrong: a damaged aliases
    file), so a start fails with one line before anything serves."""
    DataDir(root)


LOADED_FILES = ("docs.offsets.npy", "embeddings.npy", "dense.faiss")  # with bm25/, postings/, metadata/, hubness-*/
NOT_LOADED = ("docs.jsonl", MODEL_DIR, "live")  # read by offset, shared by collections of a model, the log


def _stamp(folder: Path) -> tuple:
    """What changes when a failed collection's folder is repaired or replaced: its manifest's and log's sizes and
    modification times, and the folder's identity."""
    stamp: list = [folder_identity(folder)]
    for path in (folder / MANIFEST, log_path(folder)):
        try:
            stat = path.stat()
            stamp.append((stat.st_size, stat.st_mtime_ns))
        except OSError:
            stamp.append(None)
    return tuple(stamp)


def memory_bytes(reloader: Reloader) -> int:
    """What a served collection holds in memory or maps: its index files but the stored texts, the shared model and
    the log; and its live segment's vectors."""
    serving = reloader.serving
    if serving is None:
        return 0
    total = sum(entry["bytes"] for path, entry in serving.index.manifest.files.items() if path.split("/")[0] not in NOT_LOADED)
    if isinstance(serving.view, ReadView):  # a sharded collection's live segments are its shards'
        total += serving.view.live.vectors.nbytes
    return total


class Collections:
    @classmethod
    def from_settings(cls, resources: Resources, settings, opener=None) -> Collections:
        """The collections `settings` (app.settings.Settings) describe: the data directory, the `--index` folder
        (served by `opener()` when given: cluster.serve's shards), the snapshot folder."""
        data = DataDir(settings.data_dir) if settings.data_dir is not None else None
        snapshots = None
        if settings.snapshot_dir is not None:
            snapshots = SnapshotStore(settings.snapshot_dir, settings.snapshot_keep, settings.snapshot_secret)
            resources.metrics.describe_snapshots(snapshots.infos())
        return cls(resources, data, settings.default_collection_name, settings.index, opener, snapshots)

    @property
    def tasks_folder(self) -> Path | None:
        """Where bulk-load tasks are recorded (the data directory's), or None."""
        return self.data.tasks if self.data is not None else None

    def __init__(
        self,
        resources: Resources,
        data: DataDir | None,
        default: str,
        external: Path | None = None,
        opener=None,
        snapshots: SnapshotStore | None = None,
    ):
        """`external`: a folder served beside the data directory's collections (`--index`), named after it; `opener`
        opens it instead of this process (cluster.serve's shards on Ray Serve); `snapshots`: where snapshots go."""
        self.resources, self.data, self.default_name, self._snapshots = resources, data, default, snapshots
        self.settings = resources.settings
        self.external = external
        self._external_opener = opener
        self.served: dict[str, Reloader] = {}
        # collections of the data directory that cannot be opened: name -> (why, _stamp of the folder); the others
        # serve, and each is tried again once its folder changes (a repair, a restore) or on a reload
        self.failed: dict[str, tuple[str, tuple]] = {}
        self._change = threading.Lock()  # one create, drop, open or scan at a time
        resources.metrics.failed_collections.set_function(lambda: len(self.failed))

    @property
    def aliases(self) -> dict[str, str]:
        return self.data.aliases if self.data is not None else {}

    # --- lookups ------------------------------------------------------------------------------------------------

    def resolve(self, name: str) -> Reloader:
        """The collection `name` names, directly or through an alias; NotFound (naming no other collection: the
        caller's key may not be allowed to know of them)."""
        target = self.aliases.get(name, name)
        reloader, failure = self.served.get(target), self.failed.get(target)
        if reloader is None and failure is not None:
            raise Unavailable(f"collection {target!r} cannot be served: {failure[0]}")
        if reloader is None:
            raise NotFound(f"no collection or alias named {name!r} (GET /collections lists those your key may use)")
        return reloader

    def aliases_of(self, name: str) -> list[str]:
        """The aliases that point to collection `name` (a key scoped to one of them may use the collection)."""
        return sorted(alias for alias, target in self.aliases.items() if target == name)

    def default(self) -> Reloader:
        try:
            return self.resolve(self.default_name)
        except NotFound:
            raise NotFound(
                f"no default collection: the unprefixed routes act on {self.default_name!r} (HYBRID_DEFAULT_COLLECTION), "
                "which does not exist; create it, or use /collections/{name}/..."
            ) from None

    # --- opening ------------------------------------------------------------------------------------------------

    def open_all(self) -> None:
        """At startup: every collection of the data directory and the external folder."""
        with self._change:
            if self.external is not None:
                name = name_of_folder(self.external)
                if self.data is not None and self.data.exists(name):
                    raise HybridError(f"--index {self.external} would be served as {name!r}, a collection of the data directory too")
                opener = self._external_opener or functools.partial(self._open_folder, self.external)
                self._serve(name, opener)
            if self.data is not None:
                for name in self.data.names():
                    self._serve_or_fail(name)

    def scan(self, retry: bool = False) -> list[str]:
        """Serve the collections an offline build published into the data directory since, and those that failed to
        open whose folder changed since (`retry`: all that failed); the names now served."""
        if self.data is None:
            return []
        with self._change:
            fresh = [
                name
                for name in self.data.names()
                if name not in self.served and (retry or name not in self.failed or self.failed[name][1] != _stamp(self.data.path(name)))
            ]
            return [name for name in fresh if self._serve_or_fail(name)]

    def _serve_or_fail(self, name: str) -> bool:
        """(change lock held) Serve collection `name` of the data directory, or note why it cannot be (logged once):
        one tenant's damaged folder never stops the others."""
        assert self.data is not None
        folder = self.data.path(name)
        stamp = _stamp(folder)
        try:
            self._serve(name, functools.partial(self._open_folder, folder))
        except TooMany:
            raise
        except Exception as exc:  # anything: the folder may have come from anywhere
            if self.failed.get(name, (None,))[0] != str(exc):
                logger.error("cannot serve collection %s (the others serve): %s", name, exc)
            self.failed = {**self.failed, name: (str(exc), stamp)}  # replaced whole, as `served` is
            return False
        self._forget_failure(name)
        return True

    def _forget_failure(self, name: str) -> None:
        self.failed = {n: failure for n, failure in self.failed.items() if n != name}

    def _open_folder(self, folder: Path):
        """An index folder, its documents' model session shared with the other collections of that model."""
        embedder = None
        manifest = read_manifest(folder) if not is_sharded(folder) else None
        if manifest is not None and manifest.embedder.document_backend != NO_MODEL:
            spec = manifest.embedder
            embedder = self.resources.session(folder / MODEL_DIR, model_identity(manifest), spec.document_precision, self.settings.device)
        return open_folder(folder, self.settings, embedder)

    def _serve(self, name: str, opener) -> Reloader:
        """(change lock held) Open a collection and add it to `served`."""
        self._check_room()
        reloader = Reloader(name, self.resources, opener)
        reloader.open(opener())
        self.resources.metrics.collection_bytes.labels(name).set_function(functools.partial(memory_bytes, reloader))
        self.served = {**self.served, name: reloader}
        return reloader

    def _check_room(self) -> None:
        if len(self.served) >= self.settings.max_collections:
            raise TooMany(
                f"the service serves {len(self.served)} collections, as many as HYBRID_MAX_COLLECTIONS allows: drop one or raise the limit"
            )

    # --- lifecycle ----------------------------------------------------------------------------------------------

    def _data(self) -> DataDir:
        if self.data is None:
            raise Conflict("this service has no data directory (it serves --index alone): start it with --data DIR to create collections")
        return self.data

    def create(self, name: str, settings: dict | None = None) -> Reloader:
        """A new empty collection `name` made with `settings` (`POST /collections`'s shape; SpecError naming the
        field), served at once."""
        data = self._data()
        parsed = CollectionSettings.parse(settings)
        with self._change:
            self._check_room()  # before building it
            if name in self.served:
                raise Conflict(f"a collection named {name!r} exists")
            served_models = [r.serving.index.path / MODEL_DIR for r in self.served.values() if r.serving is not None]
            data.create(name, parsed, served_models)  # a model a served index has needs no export (nor torch)
            return self._serve(name, functools.partial(self._open_folder, data.path(name)))

    def drop(self, name: str) -> None:
        data = self._data()
        with self._change:
            data.check_droppable(name)  # before it stops serving: a refused drop changes nothing
            reloader = self.served.get(name)
            if reloader is None and name in self.failed:  # it never served: only its folder goes
                data.drop(name)
                self._forget_failure(name)
                return
            if reloader is None:
                raise NotFound(f"collection {name!r} is not served here")
            self.served = {n: r for n, r in self.served.items() if n != name}  # new requests miss it from here on
            reloader.close()
            data.drop(name)
            self.resources.metrics.forget(name)
            self.resources.keep_sessions({r.model_identity for r in self.served.values() if r.model_identity})

    def set_alias(self, alias: str, collection: str) -> None:
        data = self._data()
        with self._change:
            if alias in self.served:
                raise Conflict(f"{alias!r} is a collection: collections and aliases share names")
            if collection not in self.served:
                raise NotFound(f"no collection named {collection!r}")
            data.set_alias(alias, collection)

    def drop_alias(self, alias: str) -> None:
        with self._change:
            self._data().drop_alias(alias)

    # --- snapshots ----------------------------------------------------------------------------------------------

    @property
    def snapshots(self) -> SnapshotStore:
        if self._snapshots is None:
            raise Conflict("this service keeps no snapshots: set HYBRID_SNAPSHOTS (or serve a data directory)")
        return self._snapshots

    def snapshot(self, name: str, model: str = "reference") -> SnapshotInfo:
        """A consistent snapshot of collection `name` (or the one an alias names), taken while it is served; `model`:
        reference its model's files or include them (indexer.datadir.snapshots)."""
        store = self.snapshots
        reloader = self.resolve(name)
        serving = reloader.serving
        if serving is None:
            raise Conflict(f"collection {reloader.name!r} is not loaded")
        collection = serving.collection
        frozen = collection.frozen if collection is not None else None  # read-only: nothing changes under the copy
        try:
            info = store.take(serving.index.path, reloader.name, frozen, model)
        except OSError as exc:  # a snapshot is a whole copy: a full disk is its likeliest failure
            raise StorageError.of(exc, "the snapshot was not taken (nothing of it is kept)") from None
        except (StorageError, Conflict):
            raise
        except HybridError as exc:  # a damaged file, or a folder that kept changing: nothing was kept
            raise Conflict(f"the snapshot of {reloader.name!r} was not taken: {exc}") from None
        self.resources.metrics.describe_snapshots(store.infos())
        return info

    def restore(self, name: str, source: Path, replace: bool) -> Reloader:
        """Serve the snapshot file `source` as collection `name`: a new collection, or (`replace`) in place of the
        one of that name in one atomic swap. Everything is checked in a staging folder first, the collection opened
        there and its log replayed (BadSnapshot: nothing changed); the replaced folder is kept until the restored one
        serves, and serves again (writable) if it does not."""
        data = self._data()
        settings = self.settings
        with self._change:
            old = self.served.get(name)
            if old is not None and not data.exists(name):
                raise Conflict(f"collection {name!r} is served with --index, not from the data directory: restore into a new name")
            if old is None:
                self._check_room()
            stopped = False
            was_foreign = data.has_foreign_model(name)
            data.set_model_origin(name, foreign=True)  # until it is known: a crash mid-restore lends nothing
            try:
                with data.replacing(name, replace) as replacement:
                    info = restore_into(
                        source, replacement.folder, settings.max_snapshot_bytes, settings.snapshot_secret, self._model_folders()
                    )
                    if old is not None:  # searches go on; writes wait for the restored collection
                        old.stop_writes(f"collection {name!r} is being replaced by a restore: write again once it is done")
                        stopped = True
                    replacement.publish(replace)
                    if old is not None:
                        old.open(old.opener())
                        restored = old
                    else:
                        restored = self._serve(name, functools.partial(self._open_folder, data.path(name)))
            except BaseException:
                data.set_model_origin(name, foreign=was_foreign)
                if stopped and old is not None:  # its folder is back in place: it serves and takes writes again
                    old.open(old.opener())
                raise
            data.set_model_origin(name, foreign=info.model == "included")
            self._forget_failure(name)
            logger.info("restored %s from snapshot %s (sequence %d, %d documents)", name, info.id, info.sequence, info.documents)
            return restored

    def _model_folders(self) -> list[Path]:
        served = [r.serving.index.path for r in self.served.values() if r.serving is not None]
        return model_folders(self.data, served)

    # --- upkeep -------------------------------------------------------------------------------------------------

    def refresh(self) -> None:
        """Publish every collection's pending writes (and start compactions that are due)."""
        for name, reloader in self.served.items():
            try:
                reloader.refresh()
            except Exception:  # a failed refresh keeps the previous snapshot in service; the next one retries
                logger.exception("refresh of %s failed", name)

    def reload(self) -> None:
        """Open every collection's folder again (rebuilt offline) and serve the new ones."""
        with self._change:  # not while a collection is created, dropped or restored
            for reloader in list(self.served.values()):
                reloader.reload()
        self.scan(retry=True)
        self.resources.keep_sessions({r.model_identity for r in self.served.values() if r.model_identity})

    def close(self) -> None:
        for reloader in self.served.values():
            reloader.close()
