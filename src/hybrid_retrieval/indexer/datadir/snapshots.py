"""Snapshots of a collection: one self-checking file that restores it exactly as of one point in its write sequence.

A snapshot is an uncompressed tar (index files are vectors and compiled structures; compression buys little):

    collection/<path>   every file of the index folder (the manifest's inventory, the manifest, the model), and its
                        write-ahead log cut at the snapshot's sequence number
    snapshot.json       last: what it holds (collection, sequence number, documents, the manifest's sha256, when),
                        each file's bytes and sha256, the sha256 of every archive byte before it, and its own checksum

followed by the tar's zero blocks and nothing else. One changed byte anywhere, or a missing tail, fails verification
before anything is extracted, and each extracted file is checked against its sha256 again.

Why a snapshot is consistent while writes and searches go on: the files of a base index folder never change in place
(a compaction or a settings change publishes new files by rename) and its log only grows between compactions. So a
snapshot holds compactions off while it hard-links the folder's files (a few milliseconds), and notes the log's length
under the write lock (microseconds): the log's first bytes hold exactly the writes acknowledged up to that point. The
archive is then written from the links with nothing held.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import io
import json
import logging
import os
import re
import shutil
import tarfile
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath
from typing import IO, cast

from hybrid_retrieval.common.publish import fsync_path, in_use, scratch_dir
from hybrid_retrieval.indexer.live.collection import Collection
from hybrid_retrieval.indexer.live.log import LIVE_DIR, WAL_FILE, log_path
from hybrid_retrieval.indexer.manifest import MANIFEST, Manifest, read_manifest
from hybrid_retrieval.indexer.store import open_index, verify_inventory
from hybrid_retrieval.indexer.wal import scan
from hybrid_retrieval.search.errors import HybridError

logger = logging.getLogger(__name__)

FORMAT = 1
SUFFIX = ".snapshot"
PARTIAL = ".partial"
ROOT = "collection"  # the archive folder the index folder's files sit in
TRAILER = "snapshot.json"
LOG = f"{LIVE_DIR}/{WAL_FILE}"
ID_RULE = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}-\d{8}T\d{12}Z")
_BLOCK = 1 << 20


class BadSnapshot(HybridError):
    """A file that is not a complete, intact snapshot (HTTP 422): nothing was changed."""


class SnapshotNotFound(HybridError, LookupError):
    """No snapshot of that id (HTTP 404)."""


@dataclass(frozen=True)
class SnapshotInfo:
    id: str
    collection: str
    sequence: int
    documents: int
    bytes: int
    created_at: str
    manifest_sha256: str
    format: int = FORMAT

    def to_dict(self) -> dict:
        return asdict(self)


def new_id(collection: str, when: datetime) -> str:
    return f"{collection}-{when:%Y%m%dT%H%M%S%f}Z"


# --- taking one ---------------------------------------------------------------------------------------------------


def stage(folder: Path, staging: Path) -> None:
    """Hard-link (or copy, where links cannot be made) the index folder's files and its log into `staging`; the
    caller holds compactions off while this runs (finish_log then cuts the log)."""
    manifest = read_manifest(folder)
    for rel in [*manifest.files, MANIFEST]:
        _link(folder / rel, staging / rel)
    log = log_path(folder)
    if log.exists():
        _link(log, staging / f"{LOG}.whole")  # an inode a later compaction's rewrite cannot change


def _link(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, target)
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP):
            raise
        shutil.copy2(source, target)


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


def write_archive(staging: Path, out: Path, collection: str, seq: int, documents: int, snapshot_id: str, created: datetime) -> SnapshotInfo:
    """Write the staged folder to `out` as a snapshot archive (fsync'ed); each file of the manifest's inventory is
    checked against its sha256 on the way, so a damaged index is refused rather than backed up."""
    manifest_bytes = (staging / MANIFEST).read_bytes()
    inventory = Manifest.from_dict(json.loads(manifest_bytes)).files
    names = sorted(p.relative_to(staging).as_posix() for p in staging.rglob("*") if p.is_file())
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
            info = SnapshotInfo(snapshot_id, collection, seq, documents, 0, created.isoformat(), hashlib.sha256(manifest_bytes).hexdigest())
            described = {**info.to_dict(), "files": files, "archive_sha256": hashing.hexdigest()}
            described.pop("bytes")
            trailer = _canonical({**described, "check": hashlib.sha256(_canonical(described)).hexdigest()})
            member = tarfile.TarInfo(TRAILER)
            member.size, member.mtime, member.mode = len(trailer), int(created.timestamp()), 0o644
            tar.addfile(member, io.BytesIO(trailer))
        raw.flush()
        os.fsync(raw.fileno())
    return replace(info, bytes=out.stat().st_size)


def _canonical(data: dict) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()


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


def read_info(path: Path, whole: bool = True) -> tuple[dict, int]:
    """A snapshot's trailer, checked against its own checksum and (`whole`) against every archive byte: BadSnapshot
    when anything differs. The trailer and the offset of its header. Listing reads the trailer alone (a tar's headers
    are read by seeking past the files); a restore and `hybrid snapshot verify` check the whole file."""
    try:
        with tarfile.open(path, mode="r:") as tar:
            members = tar.getmembers()
            if not members or members[-1].name != TRAILER:
                raise BadSnapshot(f"{path.name}: no {TRAILER} at the end (truncated, or not a snapshot)")
            last = members[-1]
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


def extract(path: Path, into: Path) -> SnapshotInfo:
    """Check `path` whole (read_info), then write its index folder into `into` (an empty folder), each file checked
    against its sha256 again; BadSnapshot names what is wrong."""
    trailer, _ = read_info(path)
    files = trailer["files"]
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
                target = into / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                source = tar.extractfile(member)
                assert source is not None
                digest = hashlib.sha256()
                with target.open("wb") as out:
                    while block := source.read(_BLOCK):
                        digest.update(block)
                        out.write(block)
                if digest.hexdigest() != expected["sha256"] or member.size != expected["bytes"]:
                    raise BadSnapshot(f"{path.name}: {rel} does not match its sha256 (damaged)")
                seen.add(rel)
    except (tarfile.TarError, EOFError) as exc:
        raise BadSnapshot(f"{path.name}: not a readable snapshot archive ({exc})") from None
    if missing := sorted(set(files) - seen):
        raise BadSnapshot(f"{path.name}: {len(missing)} listed file(s) missing, e.g. {missing[0]}")
    try:
        verify_inventory(into, read_manifest(into).files, "size")
    except HybridError as exc:
        raise BadSnapshot(f"{path.name}: not a complete index folder ({exc})") from None
    return _info_of(trailer, path.stat().st_size)


def _relative(member: tarfile.TarInfo) -> str:
    """The path inside the index folder of an archive member; BadSnapshot for anything but a plain file in it."""
    parts = PurePosixPath(member.name).parts
    if not member.isreg() or len(parts) < 2 or parts[0] != ROOT or any(p in ("..", ".", "") for p in parts):
        raise BadSnapshot(f"{member.name!r} is not a file of the collection's folder")
    return "/".join(parts[1:])


def _info_of(trailer: dict, size: int) -> SnapshotInfo:
    return SnapshotInfo(
        id=trailer["id"],
        collection=trailer["collection"],
        sequence=trailer["sequence"],
        documents=trailer["documents"],
        bytes=size,
        created_at=trailer["created_at"],
        manifest_sha256=trailer["manifest_sha256"],
    )


# --- the folder of snapshots ---------------------------------------------------------------------------------------


class SnapshotStore:
    """A folder of snapshot files, `<id>.snapshot`, each written as a hidden `.<id>.snapshot.partial` (locked while
    it is written) and renamed when complete: a listed snapshot is always whole. Partials a killed process left are
    removed when the store opens."""

    def __init__(self, folder: Path | str, keep: int = 0):
        """`keep`: how many snapshots of each collection to keep (the oldest go when a new one is taken); 0 keeps all."""
        self.folder, self.keep = Path(folder), keep
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

    def take(self, folder: Path, collection: str, frozen=None) -> SnapshotInfo:
        """Snapshot the index folder of `collection`. `frozen()`: a context manager that holds the collection's
        compactions off and yields its Point (Collection.frozen); without one (offline, nothing served), the folder
        is read as it is, and read again when a compaction swapped it meanwhile."""
        started = time.monotonic()
        created = datetime.now(timezone.utc)
        snapshot_id = new_id(collection, created)
        with scratch_dir(folder, "snapshot") as staging:
            if frozen is not None:
                with frozen() as point:
                    stage(folder, staging)
                seq = finish_log(staging, point.log_bytes, point.seq)
                documents = point.documents
            else:
                seq, documents = _stage_offline(folder, staging)
            with self.partial(snapshot_id + SUFFIX) as partial:
                info = write_archive(staging, partial, collection, seq, documents, snapshot_id, created)
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
        stage(folder, staging)
        if (folder / MANIFEST).read_bytes() == before == (staging / MANIFEST).read_bytes():
            seq = finish_log(staging)
            if not log_path(staging).exists():  # nothing was ever written (or the index takes no writes)
                return seq, read_manifest(staging).documents
            collection = Collection(open_index(staging, verify="size"))
            try:
                return seq, collection.snapshot.documents
            finally:
                collection.close()
        shutil.rmtree(staging)
        staging.mkdir()
    raise HybridError(f"{folder} kept changing while it was read: take the snapshot through the service's API")
