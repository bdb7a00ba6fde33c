"""The process memory helpers (common.memory): a child's peak is its own, the allocator settings take."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from hybrid_retrieval.common.memory import limit_heap_growth, peak_memory_mib


@pytest.mark.process
def test_a_child_process_reports_its_own_peak_not_its_parents():
    """A compaction's build runs in a child of the service and records its peak in the manifest: getrusage's
    ru_maxrss carried the service's peak across the exec."""
    held = np.ones(400 * 2**20, dtype=np.uint8)  # 400 MiB touched in this process
    parent = peak_memory_mib()
    code = "from hybrid_retrieval.common.memory import peak_memory_mib; print(peak_memory_mib())"
    child = float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert held.sum() == 400 * 2**20 and parent >= 400
    assert 0 < child < parent - 300


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_the_allocator_takes_the_service_settings():
    assert limit_heap_growth()
