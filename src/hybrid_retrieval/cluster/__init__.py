"""Scale-out on Ray (the optional `ray` extra): distributed index builds (cluster.build) and sharded serving on Ray
Serve (cluster.serve). Nothing outside this package imports Ray."""

from __future__ import annotations

from types import ModuleType

from hybrid_retrieval.common.errors import ConfigError


def require_ray() -> ModuleType:
    """The ray module, or a ConfigError saying how to install it."""
    try:
        import ray
    except ImportError:
        raise ConfigError("Ray is not installed: pip install 'hybrid-retrieval[ray]'") from None
    return ray


def connect(address: str | None, num_cpus: int | None = None) -> ModuleType:
    """Join the Ray cluster at `address`, or start a local instance (bound to loopback) when it is None; a process
    already connected (a test's ray.init) keeps its connection."""
    ray = require_ray()
    if not ray.is_initialized():
        if address:
            ray.init(address=address, log_to_driver=False)
        else:
            ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
    return ray
