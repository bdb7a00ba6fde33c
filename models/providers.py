"""One place that picks ONNX Runtime execution providers."""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

DEVICES = ("auto", "cpu", "gpu")


def onnx_providers(device: str = "auto") -> list[str]:
    """CUDA when asked for (or auto) and available, CPU always as the fallback.

    Warns when CUDA was explicitly requested but this onnxruntime build cannot use it.
    """
    if device not in DEVICES:
        raise ValueError(f"unknown device {device!r}; valid: {', '.join(DEVICES)}")
    import onnxruntime as ort

    available = ort.get_available_providers()
    if device != "cpu" and "CUDAExecutionProvider" in available:
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]
    if device == "gpu":
        logger.warning("GPU (CUDA) requested but onnxruntime offers only %s: using CPU", available)
    return ["CPUExecutionProvider"]
