"""The one progress bar of every long step of a build, a reembed or a load: what it counts, how many so far, the rate,
and, where the total is known, the time left. On stderr, off with `enabled=False` (`--quiet`, servers, tests)."""

from __future__ import annotations

from typing import Any


def progress_bar(total: int | None, desc: str, unit: str, enabled: bool = True) -> Any:  # a tqdm bar (untyped)
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=f" {unit}", disable=not enabled, dynamic_ncols=True, mininterval=0.5)
