"""The benchmark harness: one timer, one percentile function, one comparison rule, and the record every run writes.

A benchmark is a `Case`: a section of docs/BENCHMARKS.md, a name, what it measures, the resources it needs, and a
function from the run's `Context` to `Table`s of flat rows. `run_cases` runs the cases it is given, stamps the record
with when, where and on which code it ran, and keeps going past a case that fails or cannot run here (the record says
why); `bench.render` turns records into tables. Conclusions are columns computed here (`compare`, `verdict`), never
sentences written per section.
"""

from __future__ import annotations

import datetime
import os
import platform
import statistics
import subprocess
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from bench.machine import describe_machine

# Two medians closer than this (relative) are "within noise" unless the samples say otherwise (see `compare`).
NOISE = 0.03
# The p-value under which a difference between two samples is taken as real.
ALPHA = 0.05
# Library versions a record names (the first of each group that is installed).
LIBRARIES = (
    ("numpy",),
    ("faiss-cpu", "faiss-gpu-cu12", "faiss-gpu"),
    ("onnxruntime", "onnxruntime-gpu"),
    ("bm25s",),
    ("torch",),
    ("sentence-transformers",),
    ("fastapi",),
    ("uvicorn",),
    ("ray",),
)


@dataclass(frozen=True)
class Table:
    """Rows of one table: each a flat mapping column -> value, all rows with the same columns in the same order."""

    title: str
    rows: list[dict[str, Any]]
    note: str = ""  # how the rows were measured, when the title cannot say it


@dataclass(frozen=True)
class Case:
    section: str  # the heading it renders under
    name: str
    measures: str  # one line: what it runs, on what
    run: Callable[[Any], list[Table]]  # Context -> tables
    needs: tuple[str, ...] = ()  # resources the Context must have: "gpu", "ray", "baseline", "peers"
    headline: bool = False  # its first table's rows also go to the README


def percentiles(values_ms: Sequence[float]) -> dict[str, float]:
    """p50 / p95 / p99 of latencies in milliseconds (NaN when there are none)."""
    if not len(values_ms):
        return {"p50_ms": float("nan"), "p95_ms": float("nan"), "p99_ms": float("nan")}
    p50, p95, p99 = np.percentile(values_ms, [50, 95, 99])
    return {"p50_ms": round(float(p50), 3), "p95_ms": round(float(p95), 3), "p99_ms": round(float(p99), 3)}


def timed_ms(call: Callable[[], Any]) -> float:
    """Wall time of one call, in milliseconds."""
    start = time.perf_counter()
    call()
    return (time.perf_counter() - start) * 1000


def interleaved(calls: dict[str, Callable[[Any], Any]], inputs: Sequence[Any], warmup: int = 3) -> dict[str, list[float]]:
    """Milliseconds of every call on every input, the calls alternating input by input so that machine noise hits all
    of them alike, and the first of them rotating from one input to the next (a call that runs right after another
    on the same input finds its data in the caches); the first `warmup` inputs run once untimed."""
    for x in inputs[:warmup]:
        for call in calls.values():
            call(x)
    names = list(calls)
    times: dict[str, list[float]] = {name: [] for name in calls}
    for i, x in enumerate(inputs):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            times[name].append(timed_ms(lambda call=calls[name], x=x: call(x)))
    return times


def rate(count: int, call: Callable[[], Any]) -> float:
    """Items per second of `call`, which processes `count` items."""
    return count * 1000 / timed_ms(call)


def verdict(ratio: float, p_value: float | None = None, higher_is_better: bool = True) -> str:
    """ "better", "worse" or "within noise" for a new/old ratio: within noise when the change is at most NOISE, or when
    the samples' p-value does not reach ALPHA."""
    if abs(ratio - 1) <= NOISE + 1e-12 or (p_value is not None and p_value >= ALPHA):
        return "within noise"
    return "better" if (ratio > 1) == higher_is_better else "worse"


def compare(new: Sequence[float], old: Sequence[float], higher_is_better: bool = False) -> dict[str, Any]:
    """Two samples of one measurement (latencies by default: lower is better), taken side by side in one run: the
    ratio of their medians, a two-sided Mann-Whitney p-value, and the verdict."""
    ratio = statistics.median(new) / statistics.median(old)
    p_value = None
    if min(len(new), len(old)) >= 3:
        from scipy.stats import mannwhitneyu

        p_value = round(float(mannwhitneyu(new, old, alternative="two-sided").pvalue), 4)
    return {"ratio": round(ratio, 3), "p": p_value, "verdict": verdict(ratio, p_value, higher_is_better)}


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], capture_output=True, text=True, check=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def library_versions() -> dict[str, str]:
    versions = {}
    for names in LIBRARIES:
        for name in names:
            try:
                versions[name] = metadata.version(name)
                break
            except metadata.PackageNotFoundError:
                continue
    return versions


def stamp() -> dict[str, Any]:
    """When, where and on which code a run happens."""
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": _git("rev-parse", "--short=12", "HEAD") or "unknown",
        "dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
        "machine": describe_machine(),
        "platform": platform.platform(),
        "versions": library_versions(),
    }


@dataclass
class CaseResult:
    section: str
    name: str
    measures: str
    status: str  # "ran", "skipped: <why>", "failed: <error>"
    seconds: float = 0.0
    tables: list[dict[str, Any]] = field(default_factory=list)
    headline: bool = False


def run_case(case: Case, context: Any) -> CaseResult:
    result = CaseResult(case.section, case.name, case.measures, "ran", headline=case.headline)
    missing = [need for need in case.needs if not context.has(need)]
    if missing:
        result.status = "skipped: " + "; ".join(context.why_not(need) for need in missing)
        return result
    start = time.perf_counter()
    try:
        result.tables = [asdict(table) for table in case.run(context)]
    except Exception as exc:
        traceback.print_exc()
        result.status = f"failed: {type(exc).__name__}: {exc}"
    result.seconds = round(time.perf_counter() - start, 1)
    return result


def run_cases(
    cases: Iterable[Case],
    context: Any,
    progress: Callable[[str], None] = print,
    resumed: dict[str, Any] | None = None,
    save: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Run `cases` in order; the record: the stamp, the context's parameters and every case's result. `resumed`: a
    record of an interrupted run of the same code, whose cases that ran are kept, not run again. `save(record)` is
    called after every case, so an interruption loses at most the case in progress."""
    record: dict[str, Any] = resumed or {"stamp": stamp(), "context": context.describe(), "cases": []}
    if resumed is not None:
        record["stamp"].setdefault("resumed", []).append(stamp()["date"])
    done = {(c["section"], c["name"]): c for c in record["cases"] if c["status"] == "ran"}
    cases = list(cases)
    order = [(case.section, case.name) for case in cases]
    order += [key for key in done if key not in order]  # kept from the interrupted run, though not asked for now
    for case in cases:
        key = (case.section, case.name)
        if key in done:
            progress(f"[bench] {case.section} / {case.name}: ran before ({done[key]['seconds']:.0f} s), kept")
            continue
        progress(f"[bench] {case.section} / {case.name}")
        result = run_case(case, context)
        progress(f"[bench]   {result.status} ({result.seconds:.0f} s)")
        done[key] = asdict(result)
        record["cases"] = [done[k] for k in order if k in done]  # in catalogue order
        if save is not None:
            save(record)
    record["cases"] = [done[k] for k in order if k in done]
    return record


def rows_from(mapping: dict[str, dict[str, Any]], key: str, columns: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Rows from a mapping name -> measurements: `key` names the first column; `columns` picks and renames the others
    (all of them, in their order, without it)."""
    rows = []
    for name, values in mapping.items():
        picked = values if columns is None else {label: values.get(source) for source, label in columns.items()}
        rows.append({key: name, **picked})
    return rows


def write_record(record: dict[str, Any], path: Path) -> None:
    import json

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=1, default=str))
    os.replace(tmp, path)
