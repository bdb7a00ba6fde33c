"""Giving freed memory back to the operating system.

A compaction frees the previous base and every live document at once: many small objects (texts, metadata, term
arrays) that glibc's allocator keeps in its heap for reuse, so the process stayed several times larger after a bulk
load than after a restart. malloc_trim(0) returns the free pages of every arena; `limit_heap_growth` keeps the
heaps from growing apart in the first place.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import sys
from pathlib import Path

M_MMAP_THRESHOLD, M_ARENA_MAX = -3, -8  # glibc's mallopt parameters (malloc.h)
ARENAS = 2
MMAP_THRESHOLD = 1 << 20


@functools.cache
def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def limit_heap_growth() -> bool:
    """For a long-running service that frees as much as it allocates (a bulk load's live documents, a compaction's
    build), before its threads start: at most ARENAS malloc arenas (glibc gives threads up to 8 a core, each keeping
    its own free memory), and blocks of MMAP_THRESHOLD or more mapped on their own and unmapped when freed (glibc
    raises that threshold up to 32 MiB as such blocks are freed, after which large arrays come from the heaps and their
    pages stay). MALLOC_ARENA_MAX or MALLOC_MMAP_THRESHOLD_ in the environment win. Whether the allocator took them
    (glibc on Linux)."""
    libc = _libc()
    if libc is None or not hasattr(libc, "mallopt"):
        return False
    done = True
    for name, parameter, value in (("MALLOC_ARENA_MAX", M_ARENA_MAX, ARENAS), ("MALLOC_MMAP_THRESHOLD_", M_MMAP_THRESHOLD, MMAP_THRESHOLD)):
        if name not in os.environ:
            done = bool(libc.mallopt(parameter, value)) and done
    return done


def release_free_memory() -> bool:
    """Return the allocator's free heap pages to the system; whether it could (glibc on Linux: musl has no malloc_trim)."""
    trim = getattr(_libc(), "malloc_trim", None)
    if trim is None:
        return False
    trim(0)
    return True


def peak_memory_mib() -> float:
    """This process's peak resident memory, MiB: its address space's high-water mark (VmHWM), which an exec starts
    afresh, where /proc has it. getrusage's ru_maxrss otherwise: on Linux it keeps the forking parent's peak across
    the exec, so a child build started by a large service reported the service's peak as its own."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    import resource

    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)  # Linux: KiB
