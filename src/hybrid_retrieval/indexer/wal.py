"""The write-ahead log of a live collection: every acknowledged write batch, durable before it is acknowledged.

A record is `b"HWAL"`, `[u32 payload length]`, `[u32 crc32 of those length bytes and the payload]`, then the
payload (one JSON object), little-endian, appended and fsync'ed as one write. The magic lets a reader find the
records that follow a damaged one; the checksum covers the length, so a damaged length is caught too. (Logs
written before the magic, `[length][crc32 of payload][payload]`, are read, and rewritten in this format by the
first write.)

What can go wrong, and what happens:
- A crash mid-append leaves a torn *last* record (never acknowledged): it is cut when the log is next opened
  for writing.
- A failed append (disk full, I/O error, read-only filesystem) is rolled back before the error is answered:
  the file is cut back to its last whole record and fsync'ed. Until that succeeded, the log refuses appends.
- A damaged record followed by intact ones (a flipped bit on disk, an edited file) is never skipped silently:
  reading the log raises `CorruptLog` naming the file, the record and its offset, and `hybrid repair` salvages
  every intact record into a new log (`salvage`).
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import struct
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from hybrid_retrieval.common import fastjson
from hybrid_retrieval.common.errors import HybridError, StorageError

logger = logging.getLogger(__name__)

MAGIC = b"HWAL"
_LENGTH = struct.Struct("<I")
_HEADER = struct.Struct("<4sII")  # magic, payload length, crc32(length bytes + payload)
_V1_HEADER = struct.Struct("<II")  # payload length, crc32(payload)


class CorruptLog(HybridError):
    """A damaged record with intact records after it: the log cannot be replayed without losing them."""

    def __init__(self, path: Path, record: int, offset: int, reason: str, intact_after: int):
        super().__init__(
            f"{path}: record {record} at byte offset {offset} is damaged ({reason}), and {intact_after} intact "
            f"record(s) follow it. Nothing was applied past it. Stop the service and run `hybrid repair "
            f"{path.parent.parent}` to keep every intact record (it reports what it cannot read)"
        )
        self.path, self.record, self.offset, self.reason, self.intact_after = path, record, offset, reason, intact_after


def frame(record: dict) -> bytes:
    payload = fastjson.dumps(record)  # its numbers were checked finite
    length = _LENGTH.pack(len(payload))
    return MAGIC + length + _LENGTH.pack(zlib.crc32(payload, zlib.crc32(length))) + payload


def _write_records(path: Path, records: list[dict]) -> None:
    """Replace the file at `path` with `records`, atomically: a crash leaves the old or the new file."""
    tmp = path.with_name(path.name + ".new")
    with tmp.open("wb") as fh:
        for record in records:
            fh.write(frame(record))
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass
class Damage:
    """Bytes that hold no intact record: where they start, which record they were, why they could not be read."""

    offset: int
    end: int
    record: int  # 1-based number of the record that stood here (records before it + 1)
    reason: str

    def to_dict(self) -> dict:
        return {"record": self.record, "offset": self.offset, "bytes": self.end - self.offset, "reason": self.reason}


@dataclass
class Scan:
    """What a log file holds: intact records with their offsets, and the damaged stretches between them."""

    path: Path
    size: int
    records: list[tuple[int, int, dict]] = field(default_factory=list)  # (offset, end, record)
    damage: list[Damage] = field(default_factory=list)
    legacy: bool = False  # written before records carried the magic

    @property
    def torn_tail(self) -> Damage | None:
        """The damage at the end with no intact record after it: a crash mid-append (cut when writing resumes)."""
        if self.damage and (not self.records or self.damage[-1].offset >= self.records[-1][1]):
            return self.damage[-1]
        return None

    @property
    def clean_end(self) -> int:
        """Where the last intact record before any damage ends: appends go here."""
        return self.damage[0].offset if self.damage else self.size

    def check(self) -> None:
        """CorruptLog when damage lies before an intact record."""
        first = self.damage[0] if self.damage else None
        if first is not None and first is not self.torn_tail:
            after = sum(1 for offset, _, _ in self.records if offset > first.offset)
            raise CorruptLog(self.path, first.record, first.offset, first.reason, after)


def _read_v2(data: bytes, offset: int) -> tuple[dict, int] | str:
    """The record at `offset` and where it ends, or why there is none."""
    if len(data) - offset < _HEADER.size:
        return "short header"
    magic, length, crc = _HEADER.unpack_from(data, offset)
    if magic != MAGIC:
        return "no record marker"
    end = offset + _HEADER.size + length
    if end > len(data):
        return f"declares {length} bytes, {len(data) - offset - _HEADER.size} remain"
    payload = data[offset + _HEADER.size : end]
    if zlib.crc32(payload, zlib.crc32(data[offset + 4 : offset + 8])) != crc:
        return "checksum mismatch"
    try:
        record = fastjson.loads(payload)
    except ValueError:
        return "not JSON"
    if not isinstance(record, dict) or not isinstance(record.get("seq"), int):
        return "not a log record"
    return record, end


def _read_v1(data: bytes, offset: int) -> tuple[dict, int] | str:
    if len(data) - offset < _V1_HEADER.size:
        return "short header"
    length, crc = _V1_HEADER.unpack_from(data, offset)
    end = offset + _V1_HEADER.size + length
    payload = data[offset + _V1_HEADER.size : end]
    if end > len(data) or zlib.crc32(payload) != crc:
        return "short or checksum mismatch"
    try:
        return fastjson.loads(payload), end
    except ValueError:
        return "not JSON"


def scan(path: Path) -> Scan:
    """Read every intact record of the log at `path` (none when it does not exist); damage is recorded, not raised.
    After a damaged stretch, reading resumes at the next record marker that starts an intact record."""
    path = Path(path)
    if not path.exists():
        return Scan(path, 0)
    data = path.read_bytes()
    result = Scan(path, len(data), legacy=bool(data) and not data.startswith(MAGIC))
    read = _read_v1 if result.legacy else _read_v2
    offset = 0
    while offset < len(data):
        got = read(data, offset)
        if not isinstance(got, str):
            result.records.append((offset, got[1], got[0]))
            offset = got[1]
            continue
        if result.legacy:  # no markers to resynchronise on: what follows is unreadable
            result.damage.append(Damage(offset, len(data), len(result.records) + 1, got))
            break
        resume = data.find(MAGIC, offset + 1)
        while resume != -1 and isinstance(_read_v2(data, resume), str):
            resume = data.find(MAGIC, resume + 1)
        end = len(data) if resume == -1 else resume
        result.damage.append(Damage(offset, end, len(result.records) + 1, got))
        offset = end
    return result


class WriteAheadLog:
    """Appends records durably; `replay` reads them back. With `lock`, the log is locked for this process (flock):
    a second writer fails at once instead of interleaving records. Opening for writing cuts a torn tail and refuses
    a log with damage before intact records (CorruptLog)."""

    def __init__(self, path: Path, lock: bool = False):
        self.path = Path(path)
        self._fd: int | None = None
        try:
            created = not self.path.exists()
            new_folder = not self.path.parent.exists()
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as exc:
            raise StorageError.of(exc, f"cannot open the write-ahead log {self.path}") from None
        if lock:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise HybridError(
                    f"{self.path} is held by another process writing to this index (a running service: write through its API)"
                ) from None
        if lock:  # a rewrite the holder before us was killed in (_write_records) left its new file: never used
            self.path.with_name(self.path.name + ".new").unlink(missing_ok=True)
        self._fd = fd
        self._unrestored: OSError | None = None  # a failed append that could not be rolled back yet
        self._records: list[dict] | None = None
        try:
            if created:
                _fsync_dir(self.path.parent)  # the new file's name is durable too
            if new_folder:
                _fsync_dir(self.path.parent.parent)  # and so is its folder's (live/, made by the first write)
            found = scan(self.path)
            found.check()
            self._records = [record for _, _, record in found.records]
            if found.legacy:  # one format per file: rewrite the old records with markers before appending
                self._replace_with(self._records)
            self._end = found.clean_end if not found.legacy else os.fstat(self._fd).st_size
            if found.torn_tail is not None and not found.legacy:
                tail = found.torn_tail
                logger.warning(
                    "%s: cutting a torn record at byte %d (%d bytes, %s): a write that was never acknowledged",
                    self.path,
                    tail.offset,
                    tail.end - tail.offset,
                    tail.reason,
                )
                self._truncate()
        except OSError as exc:
            self.close()
            raise StorageError.of(exc, f"cannot prepare the write-ahead log {self.path}") from None
        except BaseException:
            self.close()
            raise

    def take_records(self) -> list[dict]:
        """The intact records the log held when it was opened (read once: the opener replays them), then forgotten."""
        records, self._records = self._records or [], None
        return records

    def append(self, record: dict) -> None:
        """Durable when this returns. On failure nothing of the record stays in the file (StorageError)."""
        if self._unrestored is not None:
            try:
                self._truncate()
            except OSError as exc:
                raise StorageError.of(
                    exc, f"{self.path} could not be restored after a failed write, so it takes no writes until it can be"
                ) from None
            self._unrestored = None
        data = frame(record)
        assert self._fd is not None  # open until close()
        try:
            written = os.write(self._fd, data)
            if written != len(data):  # the disk filled part-way
                raise OSError(errno.ENOSPC, f"No space left on device (wrote {written} of {len(data)} bytes)")
            os.fsync(self._fd)
        except OSError as exc:
            self._roll_back()
            raise StorageError.of(exc, "the write was not logged") from None
        self._end += len(data)

    def _truncate(self) -> None:
        assert self._fd is not None  # open until close()
        os.ftruncate(self._fd, self._end)
        os.fsync(self._fd)

    def _roll_back(self) -> None:
        """Cut the file back to its last whole record; if even that fails, refuse appends until it succeeds."""
        try:
            self._truncate()
        except OSError as exc:
            self._unrestored = exc
            logger.error(
                "%s: could not cut a failed write back to byte %d (%s); appends are refused until it can be", self.path, self._end, exc
            )

    def _replace_with(self, records: list[dict]) -> None:
        """Replace the file's content with `records` (a crash leaves the old or the new file) and reopen it."""
        _write_records(self.path, records)
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # nobody else can hold the new file yet
        assert self._fd is not None  # open until close()
        os.close(self._fd)
        self._fd = fd

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    @classmethod
    def rewrite(cls, path: Path, records: list[dict]) -> WriteAheadLog:
        """Replace the log with `records` atomically (a crash leaves the old or the new log) and open it locked."""
        _write_records(path, records)
        return cls(path, lock=True)

    @staticmethod
    def replay(path: Path) -> Iterator[dict]:
        """Every intact record in order. A torn tail (a write in progress, or never acknowledged) is not read;
        damage before an intact record raises CorruptLog before any record is returned."""
        found = scan(path)
        found.check()
        for _, _, record in found.records:
            yield record


@dataclass
class Salvage:
    """What `salvage` kept and what it could not read."""

    kept: list[dict]
    damage: list[Damage]
    backup: Path | None  # the damaged file, kept beside the new log

    def to_dict(self) -> dict:
        seqs = [record["seq"] for record in self.kept]
        return {
            "kept_records": len(self.kept),
            "sequences": [seqs[0], seqs[-1]] if seqs else None,
            "unreadable": [d.to_dict() for d in self.damage],
            "damaged_log": str(self.backup) if self.backup else None,
        }


def salvage(path: Path, keep: Callable[[dict], str | None] | None = None, dry_run: bool = False) -> Salvage:
    """Every intact record of a damaged log, written as the new log (atomically, while holding its lock); the old
    file is kept as `wal.log.damaged-N`. `keep(record)` may refuse records that are intact but cannot be applied
    (returning why), which are reported as damage. A torn tail is dropped like any damage."""
    path = Path(path)
    lock_fd = os.open(path, os.O_RDONLY)
    try:
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise HybridError(f"{path} is held by a running service: stop it before repairing its log") from None
        found = scan(path)
        kept, damage = [], list(found.damage)
        for number, (offset, end, record) in enumerate(found.records, start=1):
            why = keep(record) if keep is not None else None
            if why is None:
                kept.append(record)
            else:
                damage.append(Damage(offset, end, number, f"sequence {record['seq']}: {why}"))
        damage.sort(key=lambda d: d.offset)
        backup = None
        if not dry_run and (damage or found.legacy):
            n = 1
            while path.with_name(f"{path.name}.damaged-{n}").exists():
                n += 1
            backup = path.with_name(f"{path.name}.damaged-{n}")
            os.link(path, backup)
            WriteAheadLog.rewrite(path, kept).close()
        return Salvage(kept, damage, backup)
    finally:
        os.close(lock_fd)
