"""`hybrid snapshot create|restore|list|verify`: snapshots of a data directory's collections, offline (the service's
API takes them while it serves: docs/operations.md, "Backup and restore")."""

from __future__ import annotations

import json
import os
from pathlib import Path

from hybrid_retrieval.engine.collections import DEFAULT_MAX_SNAPSHOT_BYTES
from hybrid_retrieval.engine.offline import (
    SUFFIX,
    data_dir,
    read_info,
    restore_snapshot,
    snapshot_store,
    take_snapshot,
    verify_snapshot,
)


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


def run_create(args) -> None:
    data = data_dir(args.data)
    info = take_snapshot(data, args.name, snapshot_store(data, args.snapshots, args.keep, _key()), args.include_model)
    print(json.dumps(info.to_dict()))


def run_restore(args) -> None:
    data = data_dir(args.data)
    given = Path(args.snapshot)
    source = given if given.is_file() else snapshot_store(data, args.snapshots, key=_key()).path(args.snapshot.removesuffix(SUFFIX))
    info = restore_snapshot(data, args.name, source, args.replace, args.max_bytes, _key())
    print(json.dumps({**info.to_dict(), "restored_as": args.name}))


def run_list(args) -> None:
    for info in snapshot_store(data_dir(args.data), args.snapshots, key=_key()).infos(args.collection):
        print(json.dumps(info.to_dict()))


def run_verify(args) -> None:
    verify_snapshot(args.file, args.max_bytes, _key(), args.scratch, data_dir(args.data))
    trailer, _ = read_info(args.file, whole=False)
    print(json.dumps({key: value for key, value in trailer.items() if key != "files"} | {"files": len(trailer["files"])}))
