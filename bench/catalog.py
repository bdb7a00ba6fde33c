"""Every benchmark case, in the order docs/BENCHMARKS.md shows them."""

from __future__ import annotations

from bench import (
    accel_bench,
    adapt_bench,
    capacity,
    collections_bench,
    filter_bench,
    gpu_bench,
    language_bench,
    live_bench,
    longdocs,
    measure,
    million_bench,
    optimize_bench,
    peers_bench,
    profiles_bench,
    quality,
    query_bench,
    rerank_bench,
    scale_bench,
    serving_bench,
    shard_write_bench,
    snapshot_bench,
    steering_bench,
)
from bench.harness import Case

CASES: list[Case] = [  # a section renders where its first case is
    *quality.CASES,
    *peers_bench.CASES,
    *longdocs.CASES,
    *language_bench.CASES,
    *measure.CASES,
    *serving_bench.CASES,
    *filter_bench.CASES,
    *steering_bench.CASES,
    *live_bench.CASES,
    *collections_bench.CASES,
    *snapshot_bench.CASES,
    *accel_bench.CASES,
    *query_bench.CASES,
    *rerank_bench.CASES,
    *gpu_bench.CASES,
    *adapt_bench.CASES,
    *optimize_bench.CASES,
    *profiles_bench.CASES,
    *capacity.CASES,
    *million_bench.CASES,
    *scale_bench.CASES,
    *shard_write_bench.CASES,
]


def select(only: list[str] | None = None, skip: list[str] | None = None) -> list[Case]:
    """Cases whose section or name matches one of `only` (all without it), minus those matching `skip` (case-blind)."""

    def matches(case: Case, words: list[str]) -> bool:
        return any(word.lower() in (case.section.lower(), case.name.lower()) for word in words)

    known = {case.section.lower() for case in CASES} | {case.name.lower() for case in CASES}
    unknown = [word for word in (only or []) + (skip or []) if word.lower() not in known]
    if unknown:
        raise SystemExit(f"unknown section or case {unknown}; valid: " + "; ".join(f"{case.section} / {case.name}" for case in CASES))
    return [case for case in CASES if (not only or matches(case, only)) and not matches(case, skip or [])]
