"""Where FAISS and the models run: `auto` takes a GPU when the library in question sees one."""

from __future__ import annotations

from hybrid_retrieval.common.errors import ConfigError

DEVICES = ("auto", "cpu", "gpu")


def check_device(device: str) -> str:
    if device not in DEVICES:
        raise ConfigError(f"unknown device {device!r}; valid: {', '.join(DEVICES)}")
    return device
