"""Bulk loads as tasks: `PUT .../documents?wait=false` answers 202 at once, and a task upserts the documents in
batches of HYBRID_MAX_BATCH_DOCS, each durable in the collection's log before it counts as done.

Every document is checked before the task is accepted (422 naming `documents[i].field`), so a task fails only on the
server's side (a full disk, a closed collection). Its progress is kept in the data directory (`tasks/<id>.json`,
replaced atomically after each batch): after a crash, a task that was queued or running reads `interrupted`, with the
documents it had acknowledged, which are all in the collection. Searches keep answering while a load runs (its
embedding yields cores to them: indexer.live.collection).
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from hybrid_retrieval.common.errors import NotFound, SpecError
from hybrid_retrieval.common.publish import write_atomic
from hybrid_retrieval.engine.serving import Reloader
from hybrid_retrieval.indexer.live.fence import Closed
from hybrid_retrieval.indexer.live.validate import check_batch, decide_types

logger = logging.getLogger(__name__)

QUEUED, RUNNING, SUCCEEDED, FAILED, INTERRUPTED = "queued", "running", "succeeded", "failed", "interrupted"
KEPT_IN_MEMORY = 1000  # finished tasks remembered for GET /tasks (the files stay)
REOPEN_WAIT_S = 600.0  # a load waits this long for a collection a reload or restore reopens (after a compaction)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


@dataclass
class Task:
    id: str
    collection: str
    documents_total: int
    state: str = QUEUED
    documents_done: int = 0  # durable in the collection's log
    last_sequence: int | None = None
    error: str | None = None
    created_at: str = field(default_factory=_now)
    started_at: str | None = None
    finished_at: str | None = None
    seconds: float = 0.0

    @property
    def rate(self) -> float | None:
        """Documents a second while it ran."""
        return round(self.documents_done / self.seconds, 1) if self.seconds > 0 else None

    def to_dict(self) -> dict:
        return {**asdict(self), "documents_per_second": self.rate}


class Tasks:
    def __init__(self, folder: Path | None, workers: int):
        """`folder`: where tasks are kept (None: in memory only)."""
        self.folder = folder
        self._tasks: dict[str, Task] = {}
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="task")
        # one collection's tasks run one at a time, in the order they came (a later load of an id wins); collections'
        # queues run side by side
        self._queues: dict[str, deque] = {}
        if folder is not None:
            self._recover(folder)

    def _recover(self, folder: Path) -> None:
        """Tasks a crash or a stop cut short read `interrupted`."""
        for path in sorted(folder.glob("*.json"), key=lambda p: p.stat().st_mtime)[-KEPT_IN_MEMORY:]:
            try:
                task = Task(**{k: v for k, v in json.loads(path.read_text()).items() if k != "documents_per_second"})
            except (OSError, ValueError, TypeError):
                logger.warning("unreadable task file %s: skipped", path)
                continue
            if task.state in (QUEUED, RUNNING):
                task.state, task.finished_at = INTERRUPTED, _now()
                task.error = "the service stopped before the load finished: the documents done are in the collection"
                self._save(task)
            self._tasks[task.id] = task

    def submit(self, reloader: Reloader, documents: list) -> Task:
        """Check every document against the collection (SpecError naming the first bad one), then queue the load."""
        if not isinstance(documents, list):
            raise SpecError("documents", "must be a non-empty list of documents")
        serving = reloader.serving
        collection = serving.collection if serving is not None else None
        if collection is not None:
            types = collection.field_types()
            decide_types(check_batch(documents, len(documents), types, collection.vectors), types, collection.filterable)
        task = Task(uuid.uuid4().hex, reloader.name, len(documents))
        with self._lock:
            self._tasks[task.id] = task
            self._forget_old()
        self._save(task)
        with self._lock:
            queue = self._queues.setdefault(reloader.name, deque())
            queue.append((task, reloader, documents))
            if len(queue) == 1:  # no runner drains this collection's queue now
                self._pool.submit(self._drain, queue)
        logger.info("task %s: load %d documents into %s", task.id, len(documents), reloader.name)
        return task

    def _drain(self, queue: deque) -> None:
        while True:
            with self._lock:
                task, reloader, documents = queue[0]
            self._run(task, reloader, documents)
            with self._lock:
                queue.popleft()
                if not queue:
                    return

    def _run(self, task: Task, reloader: Reloader, documents: list) -> None:
        task.state, task.started_at = RUNNING, _now()
        self._save(task)
        started = time.perf_counter()
        size = reloader.settings.max_batch_docs
        try:
            for start in range(0, len(documents), size):
                if self._closing.is_set():
                    raise RuntimeError("the service stopped before the load finished: the documents done are in the collection")
                task.last_sequence = self._upsert(reloader, documents[start : start + size])
                task.documents_done = min(len(documents), start + size)
                task.seconds = time.perf_counter() - started
                self._save(task)
                logger.info("task %s: %d/%d documents in %s", task.id, task.documents_done, task.documents_total, reloader.name)
            task.state = SUCCEEDED
        except Exception as exc:
            task.state, task.error = (INTERRUPTED if self._closing.is_set() else FAILED), str(exc)
            logger.warning("task %s stopped after %d documents: %s", task.id, task.documents_done, exc)
        task.seconds, task.finished_at = time.perf_counter() - started, _now()
        self._save(task)

    def _upsert(self, reloader: Reloader, batch: list) -> int:
        """Write one batch to the collection served now (read per batch: a reload, restore or compaction may have
        replaced it). One closed under the batch is being reopened (a reload, a restore): the batch, not logged, goes
        to its successor once that serves, within REOPEN_WAIT_S."""
        deadline = time.monotonic() + REOPEN_WAIT_S
        while True:
            serving = reloader.serving
            if serving is None or serving.collection is None:
                raise RuntimeError(f"collection {reloader.name!r} no longer takes writes")
            try:
                return serving.collection.upsert(batch)
            except Closed:
                if self._closing.is_set() or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def _save(self, task: Task) -> None:
        if self.folder is not None:
            try:
                write_atomic(self.folder / f"{task.id}.json", json.dumps(task.to_dict()))
            except OSError as exc:  # progress is reported from memory; the documents' durability is the log's
                logger.warning("cannot record task %s: %s", task.id, exc)

    def _forget_old(self) -> None:
        finished = [t for t in self._tasks.values() if t.state not in (QUEUED, RUNNING)]
        for task in finished[: max(0, len(self._tasks) - KEPT_IN_MEMORY)]:
            del self._tasks[task.id]

    def get(self, task_id: str) -> Task:
        task = self._tasks.get(task_id)
        if task is None:
            raise NotFound(f"no task {task_id!r}")
        return task

    def list(self, collection: str | None = None) -> list[Task]:
        tasks = list(self._tasks.values())
        return [t for t in tasks if collection is None or t.collection == collection]

    def close(self) -> None:
        """At shutdown: loads stop after their current batch (what they acknowledged is durable)."""
        self._closing.set()
        self._pool.shutdown(wait=True, cancel_futures=True)
        for task in self._tasks.values():
            if task.state == QUEUED:
                task.state, task.finished_at, task.error = INTERRUPTED, _now(), "the service stopped before the load started"
                self._save(task)
