"""Giving freed memory back to the operating system.

A compaction frees the previous base and every live document at once: many small objects (texts, metadata, term
arrays) that glibc's allocator keeps in its heap for reuse, so the process stayed several times larger after a bulk
load than after a restart. malloc_trim(0) returns the free pages of every arena.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys
from collections.abc import Callable


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        trim: Callable[[int], int] = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
        return trim
    except (OSError, AttributeError):  # not glibc (musl has no malloc_trim)
        return None


def release_free_memory() -> bool:
    """Return the allocator's free heap pages to the system; whether it could (glibc on Linux)."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
