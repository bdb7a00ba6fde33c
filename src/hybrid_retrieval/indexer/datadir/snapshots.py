"""Snapshots of a collection: one self-checking file that restores it exactly as of one point in its write sequence.

A snapshot is an uncompressed tar (index files are vectors and compiled structures; compression buys little):

    collection/<path>   every file of the index folder (the manifest's inventory, the manifest), and its write-ahead
                        log cut at the snapshot's sequence number; the model's files only when it includes them
    snapshot.json       last: what it holds (collection, sequence number, documents, the manifest's sha256, when),
                        each file's bytes and sha256, the model's files it references (bytes and sha256), the sha256
                        of every archive byte before it, and its own checksum

By default a snapshot references the model instead of copying it (the model is most of a small collection's bytes):
a restore takes those files, by their sha256, from where the receiving side has them (another collection of that
model, or the export cache), or refuses saying so. A snapshot taken with the model included (`model=include`)
restores anywhere.

followed by the tar's zero blocks and nothing else. One changed byte anywhere, or a missing tail, fails verification
before anything is extracted, and each extracted file is checked against its sha256 again.

A snapshot file is untrusted input (a tenant may upload one it crafted): its trailer's checksum only detects damage,
so anyone can forge a consistent one. A restore therefore writes nothing but plain files of the sizes the trailer lists
(no links, devices or sparse members), at most `max_bytes` in all and never more than the archive holds, into a
staging folder outside the served tree, and opens the collection there, replaying its log, before anything is published
(`restore_into`; `hybrid snapshot verify` runs the same check). With a key (HYBRID_SNAPSHOT_KEY) every snapshot taken
carries an HMAC-SHA256 `signature` of its trailer, and only snapshots signed with that key restore: a forged or
foreign file is refused before a byte of it is written.

Why a snapshot is consistent while writes and searches go on: the files of a base index folder never change in place
(a compaction or a settings change publishes new files by rename) and its log only grows between compactions. So a
snapshot holds compactions off while it hard-links the folder's files (a few milliseconds), and notes the log's length
under the write lock (microseconds): the log's first bytes hold exactly the writes acknowledged up to that point. The
archive is then written from the links with nothing held.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import hmac
import io
import json
import logging
import os
import re
import shutil
import tarfile
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath
from typing import IO, cast

from hybrid_retrieval.common.errors import BadSnapshot, ConfigError, HybridError, SnapshotNotFound, StorageError
from hybrid_retrieval.common.publish import fsync_path, in_use, link_or_copy, scratch_dir
from hybrid_retrieval.indexer.datadir.layout import DataDir
from hybrid_retrieval.indexer.live.collection import Collection
from hybrid_retrieval.indexer.live.log import LIVE_DIR, WAL_FILE, log_path
from hybrid_retrieval.indexer.manifest import MANIFEST, Manifest, read_manifest
from hybrid_retrieval.indexer.shards.layout import is_sharded
from hybrid_retrieval.indexer.store import MODEL_DIR, open_index, sha256_file
from hybrid_retrieval.indexer.wal import scan
from hybrid_retrieval.models.onnx_export import default_cache_dir

logger = logging.getLogger(__name__)

FORMAT = 1
SUFFIX = ".snapshot"
PARTIAL = ".partial"
ROOT = "collection"  # the archive folder the index folder's files sit in
TRAILER = "snapshot.json"
LOG = f"{LIVE_DIR}/{WAL_FILE}"
ID_RULE = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}-\d{8}T\d{12}Z")
_BLOCK = 1 << 20


@dataclass(frozen=True)
class SnapshotInfo:
    id: str
    collection: str
    sequence: int
    documents: int
    bytes: int
    created_at: str
    manifest_sha256: str
    model: str = "included"  # "referenced": its model's files come from the restoring side (by sha256)
    format: int = FORMAT

    def to_dict(self) -> dict:
        return asdict(self)


def new_id(collection: str, when: datetime) -> str:
    return f"{collection}-{when:%Y%m%dT%H%M%S%f}Z"


# --- taking one ---------------------------------------------------------------------------------------------------


MODELS = ("include", "reference")  # what a snapshot does with the model's files


def is_model_file(rel: str) -> bool:
    return rel.startswith(f"{MODEL_DIR}/")


def stage(folder: Path, staging: Path, model: str = "reference") -> None:
    """Hard-link (or copy, where links cannot be made) the index folder's files and its log into `staging`, the
    model's files only with `model` "include"; the caller holds compactions off while this runs (finish_log then
    cuts the log)."""
    manifest = read_manifest(folder)
    for rel in [*manifest.files, MANIFEST]:
        if model == "include" or not is_model_file(rel):
            _link(folder / rel, staging / rel)
    log = log_path(folder)
    if log.exists():
        _link(log, staging / f"{LOG}.whole")  # an inode a later compaction's rewrite cannot change


def _link(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    link_or_copy(source, target)


def finish_log(staging: Path, length: int | None = None, expected_seq: int | None = None) -> int:
    """Cut the staged log to its first `length` bytes (None: all of them) and to its last whole record; the sequence
    number of that record (the manifest's applied sequence when the log holds none). `expected_seq`: the sequence
    number the cut must end at (a Point's)."""
    whole = staging / f"{LOG}.whole"
    log = staging / LOG
    if whole.exists():
        with whole.open("rb") as source, log.open("wb") as target:
            left = length if length is not None else os.fstat(source.fileno()).st_size
            while left > 0:
                block = source.read(min(_BLOCK, left))
                if not block:
                    break
                target.write(block)
                left -= len(block)
        whole.unlink()
        found = scan(log)
        found.check()  # a damaged record inside the acknowledged part: refuse to back up what cannot be restored
        os.truncate(log, found.clean_end)
        seq = found.records[-1][2]["seq"] if found.records else None
    else:
        seq = None
    if seq is None:
        seq = read_manifest(staging).applied_sequence
    if expected_seq is not None and seq != expected_seq:
        raise HybridError(f"the staged log ends at sequence {seq}, the snapshot point is {expected_seq}: nothing was kept")
    return seq


def write_archive(
    staging: Path,
    out: Path,
    collection: str,
    seq: int,
    documents: int,
    snapshot_id: str,
    created: datetime,
    key: bytes | None = None,
) -> SnapshotInfo:
    """Write the staged folder to `out` as a snapshot archive (fsync'ed), its trailer signed with `key` when given;
    each file of the manifest's inventory is checked against its sha256 on the way, so a damaged index is refused
    rather than backed up."""
    manifest_bytes = (staging / MANIFEST).read_bytes()
    inventory = Manifest.from_dict(json.loads(manifest_bytes)).files
    names = sorted(p.relative_to(staging).as_posix() for p in staging.rglob("*") if p.is_file())
    referenced = {rel: dict(entry) for rel, entry in inventory.items() if is_model_file(rel) and rel not in names}
    files: dict[str, dict] = {}
    with out.open("wb") as raw:
        hashing = _HashingWriter(raw)
        with tarfile.open(fileobj=cast(IO[bytes], hashing), mode="w", format=tarfile.PAX_FORMAT) as tar:
            for rel in names:
                path = staging / rel
                member = tarfile.TarInfo(f"{ROOT}/{rel}")
                member.size, member.mtime, member.mode = path.stat().st_size, int(created.timestamp()), 0o644
                with path.open("rb") as fh:
                    reader = _HashingReader(fh)
                    tar.addfile(member, reader)
                files[rel] = {"bytes": member.size, "sha256": reader.hexdigest()}
                expected = inventory.get(rel)
                if expected is not None and expected["sha256"] != files[rel]["sha256"]:
                    raise HybridError(f"index file {rel} does not match the manifest's sha256 (damaged on disk): no snapshot was kept")
            info = SnapshotInfo(
                snapshot_id,
                collection,
                seq,
                documents,
                0,
                created.isoformat(),
                hashlib.sha256(manifest_bytes).hexdigest(),
                "referenced" if referenced else "included",
            )
            described = {**info.to_dict(), "files": files, "referenced": referenced, "archive_sha256": hashing.hexdigest()}
            described.pop("bytes")
            if key is not None:
                described["signature"] = _signature(key, described)
            trailer = _canonical({**described, "check": hashlib.sha256(_canonical(described)).hexdigest()})
            member = tarfile.TarInfo(TRAILER)
            member.size, member.mtime, member.mode = len(trailer), int(created.timestamp()), 0o644
            tar.addfile(member, io.BytesIO(trailer))
        raw.flush()
        os.fsync(raw.fileno())
    return replace(info, bytes=out.stat().st_size)


def _canonical(data: dict) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()


def _signature(key: bytes, trailer: dict) -> str:
    """HMAC-SHA256 of the trailer (less its signature and check) under the server's snapshot key."""
    signed = {name: value for name, value in trailer.items() if name not in ("signature", "check")}
    return hmac.new(key, _canonical(signed), hashlib.sha256).hexdigest()


class _HashingWriter:
    """A write-only file that hashes what passes through it."""

    def __init__(self, target):
        self.target, self.digest, self.written = target, hashlib.sha256(), 0

    def write(self, data) -> int:
        self.digest.update(data)
        self.written += len(data)
        return self.target.write(data)

    def tell(self) -> int:
        return self.written

    def hexdigest(self) -> str:
        return self.digest.hexdigest()


class _HashingReader:
    def __init__(self, source):
        self.source, self.digest = source, hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        data = self.source.read(size)
        self.digest.update(data)
        return data

    def hexdigest(self) -> str:
        return self.digest.hexdigest()


# --- reading one --------------------------------------------------------------------------------------------------


def read_info(path: Path, whole: bool = True, key: bytes | None = None) -> tuple[dict, int]:  # noqa: C901
    """A snapshot's trailer, checked against its own checksum, against `key` (its signature must be that key's) and
    (`whole`) against every archive byte: BadSnapshot when anything differs. The trailer and the offset of its header.
    Listing reads the trailer alone (a tar's headers are read by seeking past the files); a restore and `hybrid
    snapshot verify` check the whole file."""
    try:
        with tarfile.open(path, mode="r:") as tar:
            members = tar.getmembers()
            if not members or members[-1].name != TRAILER:
                raise BadSnapshot(f"{path.name}: no {TRAILER} at the end (truncated, or not a snapshot)")
            last = members[-1]
            if not last.isreg() or last.issparse() or last.size > _MAX_TRAILER:
                raise BadSnapshot(f"{path.name}: its {TRAILER} is not a plain file of at most {_MAX_TRAILER} bytes")
            fh = tar.extractfile(last)
            assert fh is not None
            trailer_bytes = fh.read()
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise BadSnapshot(f"{path.name}: not a readable snapshot archive ({exc})") from None
    try:
        trailer = json.loads(trailer_bytes)
        check = trailer.pop("check")
    except (ValueError, KeyError, AttributeError, TypeError):
        raise BadSnapshot(f"{path.name}: its {TRAILER} is damaged") from None
    if hashlib.sha256(_canonical(trailer)).hexdigest() != check:
        raise BadSnapshot(f"{path.name}: its {TRAILER} does not match its checksum (damaged)")
    if trailer.get("format") != FORMAT:
        raise BadSnapshot(f"{path.name}: snapshot format {trailer.get('format')!r}; this version reads format {FORMAT}")
    _check_trailer(path.name, trailer)
    if key is not None:
        signature = trailer.get("signature")
        if not isinstance(signature, str) or not hmac.compare_digest(signature, _signature(key, trailer)):
            raise BadSnapshot(
                f"{path.name}: not signed with this server's snapshot key (HYBRID_SNAPSHOT_KEY): only snapshots taken by a "
                "server with the same key restore here"
            )
    if not whole:
        return trailer, last.offset
    with path.open("rb") as fh:
        digest = hashlib.sha256()
        left = last.offset
        while left > 0:
            block = fh.read(min(_BLOCK, left))
            if not block:
                raise BadSnapshot(f"{path.name}: truncated")
            digest.update(block)
            left -= len(block)
        if digest.hexdigest() != trailer["archive_sha256"]:
            raise BadSnapshot(f"{path.name}: its content does not match its checksum (damaged)")
        fh.seek(last.offset_data + last.size)
        if any(fh.read()):  # only the tar's padding and end-of-archive zero blocks may follow
            raise BadSnapshot(f"{path.name}: unexpected bytes after its {TRAILER} (damaged)")
    return trailer, last.offset


_MAX_TRAILER = 64 << 20  # a trailer lists each file once: far below this for any real index
_TRAILER_FIELDS: dict[str, type] = {
    "id": str,
    "collection": str,
    "sequence": int,
    "documents": int,
    "created_at": str,
    "manifest_sha256": str,
    "archive_sha256": str,
    "files": dict,
}


def _inside(rel: object) -> bool:
    """Whether `rel` is a relative path that stays inside its folder (no `..`, `.` or empty part to leave it by)."""
    if not isinstance(rel, str) or "\\" in rel or rel.startswith("/"):
        return False
    parts = PurePosixPath(rel).parts
    return bool(parts) and not any(part in ("..", ".", "") for part in parts)


def _inside_model(rel: object) -> bool:
    """Whether `rel` names a file inside the index's model folder."""
    return _inside(rel) and is_model_file(str(rel))


def _check_trailer(name: str, trailer: dict) -> None:
    """BadSnapshot unless the trailer has every field, of its type (counts and sizes never negative)."""
    for field, kind in _TRAILER_FIELDS.items():
        value = trailer.get(field)
        if not isinstance(value, kind) or isinstance(value, bool) or (isinstance(value, int) and value < 0):
            raise BadSnapshot(f"{name}: its {TRAILER} has no valid {field!r}")
    referenced = trailer.get("referenced", {})  # absent from snapshots that always included the model
    if not isinstance(referenced, dict) or not all(_inside_model(rel) for rel in referenced):
        raise BadSnapshot(f"{name}: its {TRAILER} references files that are no model's")
    for rel, entry in [*trailer["files"].items(), *referenced.items()]:
        size = entry.get("bytes") if isinstance(entry, dict) else None
        if not isinstance(size, int) or isinstance(size, bool) or size < 0 or not isinstance(entry.get("sha256"), str):
            raise BadSnapshot(f"{name}: its {TRAILER} lists {rel!r} without a valid size and sha256")


def extract(path: Path, into: Path, max_bytes: int | None = None, key: bytes | None = None, models: Iterable[Path] = ()) -> SnapshotInfo:
    """Check `path` whole (read_info, with `key`), then write its index folder into `into` (an empty folder): plain
    files only, each of the size its trailer lists and checked against its sha256, at most `max_bytes` in all (and
    never more than the archive holds), the model's files it references linked from `models` (folders of models this
    side has) by their sha256, and the manifest's inventory exactly what is there. BadSnapshot names what is wrong;
    StorageError when the disk has no room for it (checked before writing).
    """
    trailer, _ = read_info(path, key=key)
    files = trailer["files"]
    declared = sum(entry["bytes"] for entry in files.values())
    if declared > path.stat().st_size:  # plain members carry their bytes: a trailer that lists more is forged
        raise BadSnapshot(f"{path.name}: its {TRAILER} lists {declared} bytes of files, more than the archive holds")
    # a referenced model file is linked, or copied where links cannot be made: it counts against the cap too
    declared += sum(entry["bytes"] for entry in trailer.get("referenced", {}).values())
    if max_bytes is not None and declared > max_bytes:
        raise BadSnapshot(f"{path.name}: it holds {declared} bytes of files, more than a restore may write ({max_bytes})")
    into.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(into).free
    if declared > free:
        raise StorageError(
            f"restoring {path.name} needs {declared} bytes, the disk has {free} free: nothing was changed", StorageError.FULL
        )
    seen: set[str] = set()
    try:
        with tarfile.open(path, mode="r:") as tar:
            for member in tar:
                if member.name == TRAILER:
                    break
                rel = _relative(member)
                expected = files.get(rel)
                if expected is None or rel in seen:
                    raise BadSnapshot(f"{path.name}: {member.name} is not listed in its {TRAILER}")
                if member.size != expected["bytes"]:
                    raise BadSnapshot(f"{path.name}: {rel} holds {member.size} bytes, its {TRAILER} lists {expected['bytes']}")
                _copy_member(tar, member, into / rel, expected["sha256"], path.name)
                seen.add(rel)
    except (tarfile.TarError, EOFError) as exc:
        raise BadSnapshot(f"{path.name}: not a readable snapshot archive ({exc})") from None
    if missing := sorted(set(files) - seen):
        raise BadSnapshot(f"{path.name}: {len(missing)} listed file(s) missing, e.g. {missing[0]}")
    referenced = trailer.get("referenced", {})
    _link_model(path.name, referenced, into, models)
    _check_inventory(path.name, into, {**files, **referenced}, trailer["manifest_sha256"])
    return _info_of(trailer, path.stat().st_size)


def _link_model(name: str, referenced: dict, into: Path, models: Iterable[Path]) -> None:
    """Link each model file the snapshot references into `into` from the first of `models` (model folders of this
    side: other collections', the export cache's) holding a file of that name, size and sha256; BadSnapshot naming
    the model when none does."""
    if not referenced:
        return
    folders = [Path(folder) for folder in models]
    for rel, entry in referenced.items():
        inside = rel.removeprefix(f"{MODEL_DIR}/")
        for folder in folders:
            candidate = folder / inside
            if candidate.is_file() and candidate.stat().st_size == entry["bytes"] and sha256_file(candidate) == entry["sha256"]:
                _link(candidate, into / rel)
                break
        else:
            raise BadSnapshot(
                f"{name}: it references its model instead of holding it ({rel}, sha256 {entry['sha256'][:12]}), and this "
                "side has no such file: restore it where a collection of that model exists (or after creating one), "
                "or take the snapshot with the model included (POST .../snapshots?model=include, `hybrid snapshot "
                "create --include-model`)"
            )


def model_folders(data: DataDir | None, more: Iterable[Path] = ()) -> list[Path]:
    """Where a restore finds the model files a snapshot references: the models of the data directory's collections,
    of `more` index folders (those a service serves from elsewhere), and of the export cache."""
    collections = [data.path(name) for name in data.names()] if data is not None else []
    cache = default_cache_dir()
    return [*(Path(folder) / MODEL_DIR for folder in [*collections, *more]), *(sorted(cache.iterdir()) if cache.is_dir() else [])]


def _copy_member(tar: tarfile.TarFile, member: tarfile.TarInfo, target: Path, sha256: str, name: str) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    source = tar.extractfile(member)
    assert source is not None
    digest, written = hashlib.sha256(), 0
    with target.open("wb") as out:
        while block := source.read(min(_BLOCK, member.size - written + 1)):
            written += len(block)
            if written > member.size:  # never more than the member's size, whatever the reader yields
                raise BadSnapshot(f"{name}: {member.name} holds more than its {member.size} bytes")
            digest.update(block)
            out.write(block)
    if digest.hexdigest() != sha256:
        raise BadSnapshot(f"{name}: {member.name} does not match its sha256 (damaged)")


def _check_inventory(name: str, folder: Path, files: dict, manifest_sha256: str) -> None:
    """The extracted manifest must be the trailer's, and its inventory name exactly the files that were written
    (besides itself and the log), with the sha256 they were checked against: a manifest cannot point outside the
    folder or claim other content, and nothing else rides along."""
    try:
        manifest_bytes = (folder / MANIFEST).read_bytes()
        manifest = read_manifest(folder)
    except Exception as exc:  # any content: the file is untrusted
        raise BadSnapshot(f"{name}: not a complete index folder (its {MANIFEST}: {exc})") from None
    inventory = manifest.files
    if manifest.hubness is not None and not _inside(manifest.hubness.folder):
        raise BadSnapshot(f"{name}: its {MANIFEST} puts the hubness correction outside the collection's folder")
    if hashlib.sha256(manifest_bytes).hexdigest() != manifest_sha256:
        raise BadSnapshot(f"{name}: its {MANIFEST} is not the one its {TRAILER} describes")
    if unknown := sorted(set(files) - set(inventory) - {MANIFEST, LOG}):
        raise BadSnapshot(f"{name}: it holds {unknown[0]!r}, which is no file of the index its {MANIFEST} describes")
    for rel, entry in inventory.items():
        listed = files.get(rel)
        if (
            listed is None
            or not isinstance(entry, dict)
            or entry.get("sha256") != listed["sha256"]
            or entry.get("bytes") != listed["bytes"]
        ):
            raise BadSnapshot(f"{name}: its {MANIFEST} lists {rel!r}, which the snapshot does not hold as listed")


def _relative(member: tarfile.TarInfo) -> str:
    """The path inside the index folder of an archive member; BadSnapshot for anything but a plain (not sparse) file in
    it: a link, device or folder member, or a sparse one (which would write more than the archive holds)."""
    parts = PurePosixPath(member.name).parts
    plain = member.type in (tarfile.REGTYPE, tarfile.AREGTYPE) and not member.issparse()
    if not plain or len(parts) < 2 or parts[0] != ROOT or any(p in ("..", ".", "") for p in parts):
        raise BadSnapshot(f"{member.name!r} is not a plain file of the collection's folder")
    return "/".join(parts[1:])


def check_opens(folder: Path, info: SnapshotInfo) -> None:
    """Open the extracted folder as the service will, its log replayed: BadSnapshot naming what fails, or when what
    opens is not what the trailer says (sequence number, documents). Runs in the staging folder, before publishing."""
    if is_sharded(folder):
        raise BadSnapshot(f"snapshot {info.id}: it holds a sharded index, which a snapshot cannot")
    try:
        index = open_index(folder, verify="size", device="cpu")
        if log_path(folder).exists():
            collection = Collection(index, replay=True)
            try:
                seq, documents = collection.seq, collection.view.documents
            finally:
                collection.close()
        else:
            seq, documents = index.manifest.applied_sequence, index.num_docs
    except Exception as exc:  # anything at all: the folder came from outside
        raise BadSnapshot(f"snapshot {info.id}: the collection it holds does not open ({exc})") from None
    if (seq, documents) != (info.sequence, info.documents):
        raise BadSnapshot(
            f"snapshot {info.id}: it opens at sequence {seq} with {documents} documents; "
            f"its {TRAILER} says {info.sequence} and {info.documents}"
        )


def restore_into(
    path: Path, folder: Path, max_bytes: int | None = None, key: bytes | None = None, models: Iterable[Path] = ()
) -> SnapshotInfo:
    """Everything a restore checks, in `folder` (a staging folder, published only if this returns): the file whole,
    its members and referenced model (extract), the collection opened and its log replayed (check_opens)."""
    info = extract(path, folder, max_bytes, key, models)
    check_opens(folder, info)
    return info


def verify_file(
    path: Path, max_bytes: int | None = None, key: bytes | None = None, scratch: Path | None = None, models: Iterable[Path] = ()
) -> SnapshotInfo:
    """What a restore of `path` would check (restore_into), in a temporary folder under `scratch` removed after."""
    with tempfile.TemporaryDirectory(prefix=".verify-", dir=scratch) as folder:
        return restore_into(path, Path(folder), max_bytes, key, models)


def _info_of(trailer: dict, size: int) -> SnapshotInfo:
    return SnapshotInfo(
        id=trailer["id"],
        collection=trailer["collection"],
        sequence=trailer["sequence"],
        documents=trailer["documents"],
        bytes=size,
        created_at=trailer["created_at"],
        manifest_sha256=trailer["manifest_sha256"],
        # "included" as soon as one model file comes from the archive: its content is then whatever its maker chose
        model="included" if any(is_model_file(rel) for rel in trailer["files"]) or not trailer.get("referenced") else "referenced",
    )


# --- the folder of snapshots ---------------------------------------------------------------------------------------


class SnapshotStore:
    """A folder of snapshot files, `<id>.snapshot`, each written as a hidden `.<id>.snapshot.partial` (locked while
    it is written) and renamed when complete: a listed snapshot is always whole. Partials a killed process left are
    removed when the store opens."""

    def __init__(self, folder: Path | str, keep: int = 0, key: bytes | None = None):
        """`keep`: how many snapshots of each collection to keep (the oldest go when a new one is taken); 0 keeps all.
        `key`: what snapshots taken are signed with (HYBRID_SNAPSHOT_KEY)."""
        self.folder, self.keep, self.key = Path(folder), keep, key
        self.folder.mkdir(parents=True, exist_ok=True)
        self._infos: dict[str, tuple[tuple[int, int], SnapshotInfo]] = {}  # name -> ((size, mtime), info)
        self._lock = threading.Lock()
        for partial in self.folder.glob(f".*{PARTIAL}"):
            if not in_use(partial):
                logger.warning("removed %s, left by a snapshot or upload that was killed", partial)
                partial.unlink(missing_ok=True)

    def path(self, snapshot_id: str) -> Path:
        path = self.folder / f"{snapshot_id}{SUFFIX}"
        if not ID_RULE.fullmatch(snapshot_id) or not path.is_file():
            raise SnapshotNotFound(f"no snapshot {snapshot_id!r}")
        return path

    def infos(self, collection: str | None = None) -> list[SnapshotInfo]:
        """The complete snapshots (of `collection`), oldest first; a damaged file is left out (and logged)."""
        infos = []
        for path in self.folder.glob(f"*{SUFFIX}"):
            info = self._read(path)
            if info is not None and (collection is None or info.collection == collection):
                infos.append(info)
        return sorted(infos, key=lambda info: info.created_at)

    def get(self, snapshot_id: str) -> SnapshotInfo:
        info = self._read(self.path(snapshot_id))
        if info is None:
            raise BadSnapshot(f"snapshot {snapshot_id!r} is damaged")
        return info

    def _read(self, path: Path) -> SnapshotInfo | None:
        try:
            stat = path.stat()
        except FileNotFoundError:
            return None
        key = (stat.st_size, stat.st_mtime_ns)
        cached = self._infos.get(path.name)
        if cached is not None and cached[0] == key:
            return cached[1]
        try:
            trailer, _ = read_info(path, whole=False)
            if f"{trailer['id']}{SUFFIX}" != path.name:  # a renamed file would answer for another snapshot
                raise BadSnapshot(f"{path.name}: its {TRAILER} is of snapshot {trailer['id']!r}")
        except BadSnapshot as exc:
            logger.warning("not listed: %s", exc)
            return None
        info = _info_of(trailer, stat.st_size)
        self._infos[path.name] = (key, info)
        return info

    def delete(self, snapshot_id: str) -> None:
        self.path(snapshot_id).unlink()

    @contextlib.contextmanager
    def partial(self, name: str) -> Iterator[Path]:
        """A hidden file `.<name>.partial` in the store, locked while the body writes it, removed after unless the
        body moved it away."""
        path = self.folder / f".{name}{PARTIAL}"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield path
        finally:
            os.close(fd)
            path.unlink(missing_ok=True)

    def take(self, folder: Path, collection: str, frozen=None, model: str = "reference") -> SnapshotInfo:
        """Snapshot the index folder of `collection`. `frozen()`: a context manager that holds the collection's
        compactions off and yields its Point (Collection.frozen); without one (offline, nothing served), the folder
        is read as it is, and read again when a compaction swapped it meanwhile. `model`: "reference" its files by
        sha256 (the restoring side must have them), or "include" them (the snapshot restores anywhere)."""
        if model not in MODELS:
            raise ConfigError(f"model {model!r}: one of {', '.join(MODELS)}")
        started = time.monotonic()
        created = datetime.now(timezone.utc)
        snapshot_id = new_id(collection, created)
        with scratch_dir(folder, "snapshot") as staging:
            if frozen is not None:
                with frozen() as point:
                    stage(folder, staging, model)
                seq = finish_log(staging, point.log_bytes, point.seq)
                documents = point.documents
            else:
                seq, documents = _stage_offline(folder, staging)  # with the model: it opens the staged copy
                if model == "reference":
                    shutil.rmtree(staging / MODEL_DIR, ignore_errors=True)
            with self.partial(snapshot_id + SUFFIX) as partial:
                info = write_archive(staging, partial, collection, seq, documents, snapshot_id, created, self.key)
                final = self.folder / f"{snapshot_id}{SUFFIX}"
                os.rename(partial, final)
                fsync_path(self.folder)
        logger.info(
            "snapshot %s of %s: sequence %d, %d documents, %d bytes in %.2f s",
            info.id,
            collection,
            seq,
            documents,
            info.bytes,
            time.monotonic() - started,
        )
        self.prune(collection)
        return info

    def prune(self, collection: str) -> list[str]:
        """Remove the oldest snapshots of `collection` beyond `keep`; their ids."""
        if self.keep <= 0:
            return []
        with self._lock:
            doomed = self.infos(collection)[: -self.keep]
            for info in doomed:
                with contextlib.suppress(FileNotFoundError):
                    (self.folder / f"{info.id}{SUFFIX}").unlink()
        return [info.id for info in doomed]


def _stage_offline(folder: Path, staging: Path) -> tuple[int, int]:
    """Stage a folder no process of ours holds: if a compaction or settings change swapped its manifest while it was
    linked, start over. (sequence, documents), found by opening the staged copy."""
    for _ in range(5):
        before = (folder / MANIFEST).read_bytes()
        stage(folder, staging, "include")
        if (folder / MANIFEST).read_bytes() == before == (staging / MANIFEST).read_bytes():
            seq = finish_log(staging)
            if not log_path(staging).exists():  # nothing was ever written (or the index takes no writes)
                return seq, read_manifest(staging).documents
            collection = Collection(open_index(staging, verify="size"))
            try:
                return seq, collection.view.documents
            finally:
                collection.close()
        shutil.rmtree(staging)
        staging.mkdir()
    raise HybridError(f"{folder} kept changing while it was read: take the snapshot through the service's API")
