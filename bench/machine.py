"""What the benchmarks ran on, as seen at run time: stored in the bench JSON so docs/BENCHMARKS.md states the real device."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path


def cpu_model() -> str:
    """The CPU's "model name" from /proc/cpuinfo, else platform.processor(), else "unknown CPU"."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def gpu_names(timeout_s: float = 5.0) -> list[str]:
    """GPU names that `nvidia-smi` lists; empty when it is missing, fails or hangs."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=timeout_s, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError, ValueError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def faiss_gpus() -> int:
    """GPUs that the installed faiss can use (0 for a CPU-only build or without faiss)."""
    try:
        import faiss
    except ImportError:
        return 0
    try:
        return int(faiss.get_num_gpus()) if hasattr(faiss, "get_num_gpus") else 0
    except Exception:
        return 0


def onnx_providers() -> list[str]:
    """ONNX Runtime's available execution providers (empty without onnxruntime)."""
    try:
        import onnxruntime
    except ImportError:
        return []
    try:
        return list(onnxruntime.get_available_providers())
    except Exception:
        return []


def describe_machine() -> dict:
    """CPU model and count, GPUs by name, what faiss and ONNX Runtime can use, Python version."""
    return {
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "gpus": gpu_names(),
        "faiss_gpus": faiss_gpus(),
        "onnx_providers": onnx_providers(),
        "python": platform.python_version(),
    }


if __name__ == "__main__":
    import json

    print(json.dumps(describe_machine(), indent=2))
