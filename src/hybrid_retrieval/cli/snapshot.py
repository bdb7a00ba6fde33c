"""`hybrid snapshot create|restore|list|verify`: snapshots of a data directory's collections, offline (the service's
API takes them while it serves: docs/operations.md, "Backup and restore")."""

from __future__ import annotations

import json
import os
from pathlib import Path

from hybrid_retrieval.common.errors import ConfigError, NotFound
from hybrid_retrieval.common.publish import in_use
from hybrid_retrieval.engine.collections import DEFAULT_MAX_SNAPSHOT_BYTES
from hybrid_retrieval.indexer.datadir.layout import DataDir
from hybrid_retrieval.indexer.datadir.snapshots import (
    SUFFIX,
    SnapshotStore,
    model_folders,
    read_info,
    restore_into,
    verify_file,
)
from hybrid_retrieval.indexer.live.log import log_path


def register(commands) -> None:
    p = commands.add_parser("snapshot", help="snapshot a collection to one file, list snapshots, restore one (offline)")
    snapshot = p.add_subparsers(dest="snapshot_command", required=True)

    def with_folders(parser) -> None:
        parser.add_argument("--data", type=Path, help="the data directory (default $HYBRID_DATA or ./data)")
        parser.add_argument("--snapshots", type=Path, help="the snapshot folder (default $HYBRID_SNAPSHOTS or DATA/snapshots)")

    p = snapshot.add_parser("create", help="snapshot collection NAME of the data directory (use the API while a service serves it)")
    p.add_argument("name")
    with_folders(p)
    p.add_argument("--keep", type=int, default=0, help="keep this many snapshots of the collection, removing the oldest (0: all)")
    p.add_argument(
        "--include-model",
        action="store_true",
        help="copy the model's files in (by default the snapshot references them by sha256 and restores where that model is)",
    )
    p.set_defaults(run=run_create)

    p = snapshot.add_parser("restore", help="restore a snapshot (a file, or a listed id) as collection --as NAME")
    p.add_argument("snapshot", help="a snapshot file, or the id of one in the snapshot folder")
    p.add_argument("--as", dest="name", required=True, help="the collection it becomes")
    p.add_argument("--replace", action="store_true", help="replace the collection of that name (only while no service writes it)")
    with_folders(p)
    checked(p)
    p.set_defaults(run=run_restore)

    p = snapshot.add_parser("list", help="the complete snapshots in the snapshot folder, oldest first (JSON lines)")
    p.add_argument("--collection", help="only this collection's")
    with_folders(p)
    p.set_defaults(run=run_list)

    p = snapshot.add_parser(
        "verify",
        help="check a snapshot file as a restore does (every byte's checksum, its members, the collection opened and its log "
        "replayed in a scratch folder) and print what it holds",
    )
    p.add_argument("file", type=Path)
    p.add_argument("--scratch", type=Path, help="where the check extracts it (default: the system's temporary folder)")
    p.add_argument("--data", type=Path, help="a data directory whose models a snapshot that references its model may use")
    checked(p)
    p.set_defaults(run=run_verify)


def checked(parser) -> None:
    parser.add_argument(
        "--max-bytes",
        type=int,
        default=int(os.environ.get("HYBRID_MAX_SNAPSHOT_BYTES") or DEFAULT_MAX_SNAPSHOT_BYTES),
        help="the most bytes of files a restore may write (default $HYBRID_MAX_SNAPSHOT_BYTES or 64 GiB)",
    )


def _key() -> bytes | None:
    """HYBRID_SNAPSHOT_KEY, as the service reads it: when set, only snapshots signed with it restore."""
    return os.environ.get("HYBRID_SNAPSHOT_KEY", "").encode() or None


def _data(args) -> DataDir:
    return DataDir(args.data or os.environ.get("HYBRID_DATA") or "data")


def _store(args, data: DataDir, keep: int = 0) -> SnapshotStore:
    return SnapshotStore(args.snapshots or os.environ.get("HYBRID_SNAPSHOTS") or data.root / "snapshots", keep, _key())


def run_create(args) -> None:
    data = _data(args)
    if not data.exists(args.name):
        raise NotFound(f"no collection named {args.name!r} in {data.root}")
    info = _store(args, data, args.keep).take(data.path(args.name), args.name, model="include" if args.include_model else "reference")
    print(json.dumps(info.to_dict()))


def run_restore(args) -> None:
    data = _data(args)
    given = Path(args.snapshot)
    source = given if given.is_file() else _store(args, data).path(args.snapshot.removesuffix(SUFFIX))
    if args.replace and data.exists(args.name):
        _check_not_written(data.path(args.name))
    was_foreign = data.has_foreign_model(args.name)
    data.set_model_origin(args.name, foreign=True)  # until it is known: a crash mid-restore lends nothing
    try:
        with data.replacing(args.name, args.replace) as replacement:
            info = restore_into(source, replacement.folder, args.max_bytes, _key(), model_folders(data))
            replacement.publish(args.replace)
    except BaseException:
        data.set_model_origin(args.name, foreign=was_foreign)
        raise
    data.set_model_origin(args.name, foreign=info.model == "included")
    print(json.dumps({**info.to_dict(), "restored_as": args.name}))


def _check_not_written(folder: Path) -> None:
    """Refuse to replace a collection whose log a running service holds: it would go on writing the old one."""
    if in_use(log_path(folder)):
        raise ConfigError(f"a running service writes {folder.name!r}: restore through its API (POST .../snapshots/restore?replace=true)")


def run_list(args) -> None:
    for info in _store(args, _data(args)).infos(args.collection):
        print(json.dumps(info.to_dict()))


def run_verify(args) -> None:
    verify_file(args.file, args.max_bytes, _key(), args.scratch, model_folders(_data(args)))
    trailer, _ = read_info(args.file, whole=False)
    print(json.dumps({key: value for key, value in trailer.items() if key != "files"} | {"files": len(trailer["files"])}))
