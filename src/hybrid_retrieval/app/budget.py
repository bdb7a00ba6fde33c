"""Every request's time budget (search.budget.Deadline): created when its work starts, cancelled at shutdown."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from hybrid_retrieval.search.budget import Deadline


class Deadlines:
    """The deadlines of the work in progress: `search_seconds` for searches, `write_seconds` for writes."""

    def __init__(self, search_seconds: float, write_seconds: float):
        self.search_seconds, self.write_seconds = search_seconds, write_seconds
        self._active: set[Deadline] = set()
        self._lock = threading.Lock()
        self._closed: str | None = None

    @contextlib.contextmanager
    def start(self, seconds: float, setting: str = "HYBRID_REQUEST_TIMEOUT") -> Iterator[Deadline]:
        deadline = Deadline(seconds, setting)
        with self._lock:
            if self._closed is not None:
                deadline.cancel(self._closed)
            self._active.add(deadline)
        try:
            yield deadline
        finally:
            with self._lock:
                self._active.discard(deadline)

    def cancel_all(self, why: str) -> None:
        """Stop the work in progress at its next check, and any that starts from now on."""
        with self._lock:
            self._closed = why
            for deadline in self._active:
                deadline.cancel(why)
