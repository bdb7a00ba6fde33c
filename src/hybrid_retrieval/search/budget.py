"""A request's time budget: a deadline that the long loops check between steps, so work past it stops.

Python cannot stop a thread from outside, so cancellation is cooperative: the service sets a `Deadline` for the
request (`within(deadline)`) and the stages that can run long (model batches of the embedder and cross-encoder,
semantic highlights, the searches of a batch) call `check()` between steps. A step is one model batch at most, so
work stops within about one batch of the deadline. `Deadline.cancel()` stops a request early (the service does at
shutdown, so it never waits on work nobody will read).
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections.abc import Iterator

from hybrid_retrieval.common.errors import DeadlineExceeded

_current: contextvars.ContextVar[Deadline | None] = contextvars.ContextVar("deadline", default=None)


class Deadline:
    """`seconds` from now; `check(stage)` raises DeadlineExceeded once it has passed or the request was cancelled.
    `setting`: what sets the budget, named in the message."""

    def __init__(self, seconds: float, setting: str = "HYBRID_REQUEST_TIMEOUT"):
        self.seconds, self.setting = seconds, setting
        self.expires = time.monotonic() + seconds
        self.cancelled: str | None = None

    def cancel(self, why: str) -> None:
        self.cancelled = why

    def check(self, stage: str = "") -> None:
        if self.cancelled is not None:
            raise DeadlineExceeded(f"stopped{' during ' + stage if stage else ''}: {self.cancelled}")
        if time.monotonic() > self.expires:
            raise DeadlineExceeded(
                f"ran past its {self.seconds:g} s deadline{' during ' + stage if stage else ''} and was stopped ({self.setting})"
            )


def current() -> Deadline | None:
    """The deadline of the request this thread works for (None: no budget, e.g. the CLI and evaluation)."""
    return _current.get()


def check(stage: str = "") -> None:
    deadline = _current.get()
    if deadline is not None:
        deadline.check(stage)


@contextlib.contextmanager
def within(deadline: Deadline | None) -> Iterator[None]:
    """Run the body under `deadline` (threads it starts with a copied context see it too)."""
    token = _current.set(deadline)
    try:
        yield
    finally:
        _current.reset(token)
