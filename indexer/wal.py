"""The write-ahead log of a live collection: every acknowledged write batch, durable before it is acknowledged.

A record is `[u32 payload length][u32 crc32 of payload][payload: one JSON object]`, little-endian, appended and
fsync'ed as one write. A crash can only leave a torn last record (never acknowledged): replay stops at the first
record that is short or fails its checksum and cuts the file there, so a batch is applied whole or not at all.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path

from search.errors import HybridError

logger = logging.getLogger(__name__)

_HEADER = struct.Struct("<II")


def _frame(record: dict) -> bytes:
    payload = json.dumps(record, ensure_ascii=False, separators=(",", ":")).encode()
    return _HEADER.pack(len(payload), zlib.crc32(payload)) + payload


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class WriteAheadLog:
    """Appends records durably; `replay` reads them back (and repairs a torn tail). With `lock`, the log is
    locked for this process (flock): a second writer fails at once instead of interleaving records."""

    def __init__(self, path: Path, lock: bool = False):
        self.path = Path(path)
        created = not self.path.exists()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        if lock:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(self._fd)
                raise HybridError(f"{self.path} is held by another process writing to this index (a running service: "
                                  "write through its API)") from None
        if created:
            _fsync_dir(self.path.parent)  # the new file's name is durable too

    def append(self, record: dict) -> None:
        data = _frame(record)
        written = os.write(self._fd, data)
        if written != len(data):  # a short write (disk full): the tail is torn, never acknowledged
            raise OSError(f"{self.path}: wrote {written} of {len(data)} bytes")
        os.fsync(self._fd)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    @classmethod
    def rewrite(cls, path: Path, records: list[dict]) -> "WriteAheadLog":
        """Replace the log with `records` atomically (a crash leaves the old or the new log) and open it locked."""
        tmp = path.with_name(path.name + ".new")
        with tmp.open("wb") as fh:
            for record in records:
                fh.write(_frame(record))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        _fsync_dir(path.parent)
        return cls(path, lock=True)

    @staticmethod
    def replay(path: Path, repair: bool = False) -> Iterator[dict]:
        """Every complete record in order; a torn or corrupt tail is never applied, and with `repair` (only while
        holding the lock: another process may be mid-append) it is cut off, so later appends follow good records."""
        path = Path(path)
        if not path.exists():
            return
        with path.open("rb") as fh:
            data = fh.read()
        offset = 0
        while offset < len(data):
            if offset + _HEADER.size > len(data):
                break
            length, crc = _HEADER.unpack_from(data, offset)
            payload = data[offset + _HEADER.size : offset + _HEADER.size + length]
            if len(payload) < length or zlib.crc32(payload) != crc:
                break
            yield json.loads(payload)
            offset += _HEADER.size + length
        if offset < len(data) and repair:
            logger.warning("%s: cutting a torn record at byte %d (%d bytes): a write that was never acknowledged",
                           path, offset, len(data) - offset)
            with path.open("r+b") as fh:
                fh.truncate(offset)
                fh.flush()
                os.fsync(fh.fileno())
