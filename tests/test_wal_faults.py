"""The write-ahead log under faults: failed appends are rolled back, damage is never skipped silently, repair
keeps every intact record, and nothing a write logs can fail to apply."""

from __future__ import annotations

import base64
import errno
import json
import shutil
import struct
import subprocess
import sys
import zlib

import numpy as np
import pytest

from hybrid_retrieval.common.errors import SpecError, StorageError
from hybrid_retrieval.indexer import wal as wal_module
from hybrid_retrieval.indexer.live.collection import Collection
from hybrid_retrieval.indexer.live.log import LIVE_DIR, WAL_FILE
from hybrid_retrieval.indexer.live.repair import repair_log
from hybrid_retrieval.indexer.live.replay import ReplayError
from hybrid_retrieval.indexer.store import open_index
from hybrid_retrieval.indexer.wal import CorruptLog, WriteAheadLog, frame, salvage, scan

RECORDS = [{"seq": n, "op": "delete", "ids": [f"x{n}"]} for n in range(1, 5)]


def write_log(path, records=RECORDS):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(frame(r) for r in records))
    return path


def offsets(records=RECORDS):
    out, at = [], 0
    for record in records:
        out.append(at)
        at += len(frame(record))
    return out


@pytest.mark.parametrize("fault", ["short write", "ENOSPC on write", "EIO on fsync"])
def test_a_failed_append_is_rolled_back_and_the_log_keeps_taking_writes(tmp_path, monkeypatch, fault):
    path = tmp_path / "live" / "wal.log"
    log = WriteAheadLog(path, lock=True)
    log.append(RECORDS[0])
    size = path.stat().st_size
    real_write, real_fsync = wal_module.os.write, wal_module.os.fsync

    def half_write(fd, data):  # the disk fills part-way: half the record reaches the file
        return real_write(fd, data[: len(data) // 2])

    def enospc(fd, data):
        real_write(fd, data[:7])
        raise OSError(errno.ENOSPC, "No space left on device")

    def eio(fd):
        raise OSError(errno.EIO, "Input/output error")

    if fault == "EIO on fsync":
        monkeypatch.setattr(wal_module.os, "fsync", eio)
    else:
        monkeypatch.setattr(wal_module.os, "write", half_write if fault == "short write" else enospc)
    with pytest.raises(StorageError) as error:
        log.append(RECORDS[1])
    assert error.value.kind == (StorageError.IO if fault == "EIO on fsync" else StorageError.FULL)
    monkeypatch.setattr(wal_module.os, "write", real_write)
    monkeypatch.setattr(wal_module.os, "fsync", real_fsync)
    assert path.stat().st_size == size  # nothing of the failed record stays
    log.append(RECORDS[2])
    log.close()
    assert [r["seq"] for r in WriteAheadLog.replay(path)] == [1, 3]


def test_a_log_that_cannot_be_cut_back_refuses_appends_until_it_can(tmp_path, monkeypatch):
    path = tmp_path / "wal.log"
    log = WriteAheadLog(path, lock=True)
    log.append(RECORDS[0])
    real_write, real_truncate = wal_module.os.write, wal_module.os.ftruncate

    def fail(*args):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(wal_module.os, "write", lambda fd, data: real_write(fd, data[:5]) and fail())
    monkeypatch.setattr(wal_module.os, "ftruncate", fail)
    with pytest.raises(StorageError):
        log.append(RECORDS[1])
    monkeypatch.setattr(wal_module.os, "write", real_write)
    with pytest.raises(StorageError, match="could not be restored"):  # the torn bytes are still there: refused
        log.append(RECORDS[2])
    monkeypatch.setattr(wal_module.os, "ftruncate", real_truncate)
    log.append(RECORDS[2])  # restored first, then appended
    log.close()
    assert [r["seq"] for r in WriteAheadLog.replay(path)] == [1, 3]


@pytest.mark.parametrize("where", ["marker", "length", "checksum", "payload start", "payload end"])
def test_a_damaged_record_before_intact_ones_refuses_to_open_and_repair_keeps_the_rest(tmp_path, where):
    path = write_log(tmp_path / "live" / "wal.log")
    start = offsets()[2]  # record 3 of 4
    byte = {"marker": 1, "length": 5, "checksum": 9, "payload start": 13, "payload end": len(frame(RECORDS[2])) - 2}[where]
    data = bytearray(path.read_bytes())
    data[start + byte] ^= 0x20
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptLog) as error:
        list(WriteAheadLog.replay(path))
    assert (error.value.record, error.value.offset, error.value.intact_after) == (3, start, 1)
    assert str(path) in str(error.value) and f"byte offset {start}" in str(error.value) and "hybrid repair" in str(error.value)
    with pytest.raises(CorruptLog):
        WriteAheadLog(path, lock=True)  # nor is it appended to (which would bury the damage)
    report = salvage(path)
    assert [r["seq"] for r in report.kept] == [1, 2, 4]
    assert [(d.record, d.offset) for d in report.damage] == [(3, start)]
    assert report.backup.read_bytes() == bytes(data)  # the damaged file is kept beside the new log
    assert [r["seq"] for r in WriteAheadLog.replay(path)] == [1, 2, 4]


def test_a_torn_last_record_is_cut_when_writing_resumes(tmp_path):
    path = write_log(tmp_path / "wal.log")
    whole = path.read_bytes()
    path.write_bytes(whole + frame({"seq": 5, "op": "delete", "ids": ["y"]})[:-3])
    assert [r["seq"] for r in WriteAheadLog.replay(path)] == [1, 2, 3, 4]
    log = WriteAheadLog(path, lock=True)
    assert path.read_bytes() == whole
    log.append({"seq": 5, "op": "delete", "ids": ["z"]})
    log.close()
    assert [r["ids"] for r in WriteAheadLog.replay(path)][-1] == ["z"]


def test_a_log_of_the_previous_format_is_read_and_rewritten_with_markers(tmp_path):
    path = tmp_path / "wal.log"
    old = b""
    for record in RECORDS[:2]:
        payload = json.dumps(record).encode()
        old += struct.pack("<II", len(payload), zlib.crc32(payload)) + payload
    path.write_bytes(old + b"\x10\x00")  # and a torn tail
    assert [r["seq"] for r in WriteAheadLog.replay(path)] == [1, 2]
    log = WriteAheadLog(path, lock=True)
    log.append(RECORDS[2])
    log.close()
    assert not scan(path).legacy and [r["seq"] for r in WriteAheadLog.replay(path)] == [1, 2, 3]


@pytest.fixture
def index_dir(tiny_index, tmp_path):
    shutil.copytree(tiny_index, tmp_path / "index")
    return tmp_path / "index"


POISON = [10**400, float("inf"), float("nan"), "\ud800", ["a", "\udfff"], {"nested": 1}, [1, 2]]


@pytest.mark.parametrize("value", POISON, ids=repr)
def test_a_poison_value_is_refused_before_it_is_logged(index_dir, value):
    collection = Collection(open_index(index_dir))
    collection.upsert([{"id": "ok", "text": "fine", "metadata": {"score": 1.5}}])
    size = collection.wal_path.stat().st_size
    with pytest.raises(SpecError) as error:
        collection.upsert([{"id": "p", "text": "poison", "metadata": {"score": value}}])
    assert error.value.loc == ("documents", 0, "metadata", "score")
    assert collection.wal_path.stat().st_size == size
    collection.close()
    assert Collection(open_index(index_dir)).get("ok") is not None  # the index opens, the good write is there


def test_big_integers_are_stored_as_floats_and_the_field_keeps_its_type(index_dir):
    collection = Collection(open_index(index_dir))
    collection.upsert([{"id": "big", "text": "big", "metadata": {"n": 2**70, "tag": "a"}}])
    assert collection.get("big")["metadata"]["n"] == float(2**70)
    with pytest.raises(SpecError, match="the field is float in this collection"):
        collection.upsert([{"id": "s", "text": "s", "metadata": {"n": "text"}}])
    with pytest.raises(SpecError, match="the field is keyword"):
        collection.upsert([{"id": "s", "text": "s", "metadata": {"tag": 4}}])
    with pytest.raises(SpecError) as error:  # one batch cannot give a new field two types
        collection.upsert([{"id": "u", "text": "u", "metadata": {"new": 1}}, {"id": "v", "text": "v", "metadata": {"new": "x"}}])
    assert error.value.loc == ("documents", 1, "metadata", "new")
    collection.close()


def _poisoned_record(index_dir, seq: int) -> dict:
    """A record an earlier version could log: valid framing, a metadata value no column can hold."""
    vector = base64.b64encode(np.zeros(open_index(index_dir).dense.dimension, "<f4").tobytes()).decode()
    return {
        "seq": seq,
        "op": "upsert",
        "documents": [{"id": "bad", "title": "", "text": "poison", "vector": vector, "metadata": {"score": 10**400}}],
    }


def test_a_record_that_cannot_be_applied_stops_the_replay_naming_it_and_repair_drops_it(index_dir):
    collection = Collection(open_index(index_dir))
    collection.upsert([{"id": "a", "text": "first"}])
    collection.close()
    path = index_dir / LIVE_DIR / WAL_FILE
    good = [json.loads(json.dumps(r)) for r in WriteAheadLog.replay(path)]
    write_log(path, [*good, _poisoned_record(index_dir, 2), {"seq": 3, "op": "delete", "ids": ["d1"]}])
    with pytest.raises(ReplayError, match="sequence number 2 cannot be applied"):
        Collection(open_index(index_dir))
    report = repair_log(index_dir)
    assert [r["seq"] for r in report.kept] == [1, 3] and "sequence 2" in report.damage[0].reason
    reopened = Collection(open_index(index_dir))
    assert reopened.get("a") is not None and reopened.get("d1") is None and reopened.get("bad") is None


@pytest.mark.server
def test_the_service_refuses_a_damaged_log_naming_file_and_offset_and_serves_all_after_repair(index_dir, tmp_path):
    collection = Collection(open_index(index_dir))
    for n in range(4):
        collection.upsert([{"id": f"w{n}", "text": f"written {n}"}])
    collection.close()
    path = index_dir / LIVE_DIR / WAL_FILE
    found = scan(path)
    third = found.records[2][0]
    data = bytearray(path.read_bytes())
    data[third + 40] ^= 0x01  # one flipped bit in record 3 of 4
    path.write_bytes(bytes(data))
    started = subprocess.run(
        [sys.executable, "-m", "hybrid_retrieval.app", "--index", str(index_dir), "--port", "1", "--log-format", "text"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert started.returncode != 0
    assert str(path) in started.stderr and f"record 3 at byte offset {third}" in started.stderr and "hybrid repair" in started.stderr
    repaired = subprocess.run(
        [sys.executable, "-m", "hybrid_retrieval.cli", "repair", str(index_dir)], capture_output=True, text=True, timeout=300
    )
    assert repaired.returncode == 1, repaired.stderr  # something was dropped
    report = json.loads(repaired.stdout)
    assert report["kept_records"] == 3 and report["unreadable"][0]["record"] == 3 and report["unreadable"][0]["offset"] == third
    reopened = Collection(open_index(index_dir))
    assert [reopened.get(f"w{n}") is not None for n in range(4)] == [True, True, False, True]


def test_the_first_write_makes_the_new_log_and_its_folder_durable(tmp_path, monkeypatch):
    """The log's name, and the name of the live/ folder the first write makes, are fsynced before a write is
    acknowledged: a power loss cannot take the folder, and every write in it, away."""
    synced = []
    fsync_dir = wal_module._fsync_dir
    monkeypatch.setattr(wal_module, "_fsync_dir", lambda path: (synced.append(path), fsync_dir(path)))
    log = WriteAheadLog(tmp_path / "index" / LIVE_DIR / WAL_FILE)
    log.append({"seq": 1, "op": "delete", "ids": ["a"]})
    log.close()
    assert tmp_path / "index" / LIVE_DIR in synced and tmp_path / "index" in synced


def test_what_a_killed_rewrite_left_is_removed_by_the_next_writer(tmp_path):
    path = tmp_path / LIVE_DIR / WAL_FILE
    WriteAheadLog(path).close()
    path.with_name(WAL_FILE + ".new").write_bytes(b"half a rewrite")
    WriteAheadLog(path, lock=False).close()  # a reader leaves it: the writer may be rewriting now
    assert path.with_name(WAL_FILE + ".new").exists()
    WriteAheadLog(path, lock=True).close()
    assert not path.with_name(WAL_FILE + ".new").exists() and path.exists()
