"""Run a module as `python -m` would, with a SIGKILL planted at one step, for crash tests:

    KILL_AT=package.module:attribute[.attribute][@n]  KILL_RUN=hybrid_retrieval.app  python -m tests.kill_at ARGS...

The n-th call (default the first) of that function kills the process before the call runs: no exception handler,
`finally` or shutdown hook runs, as with a power cut between two steps.
"""

from __future__ import annotations

import functools
import importlib
import os
import runpy
import signal
import sys


def plant(spec: str) -> None:
    target, _, nth = spec.partition("@")
    module_name, _, path = target.partition(":")
    owner = importlib.import_module(module_name)
    *parents, name = path.split(".")
    for parent in parents:
        owner = getattr(owner, parent)
    original = getattr(owner, name)
    calls = 0

    @functools.wraps(original)
    def killing(*args, **kwargs):
        nonlocal calls
        calls += 1
        if calls == int(nth or 1):
            os.kill(os.getpid(), signal.SIGKILL)
        return original(*args, **kwargs)

    setattr(owner, name, killing)


if __name__ == "__main__":
    plant(os.environ["KILL_AT"])
    sys.argv = [os.environ["KILL_RUN"], *sys.argv[1:]]
    runpy.run_module(os.environ["KILL_RUN"], run_name="__main__", alter_sys=True)
