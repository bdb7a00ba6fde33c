"""`hybrid optimize` with its default budget: what each step did on the held-out part of the train queries, the time and
peak memory it took on this machine, and what the published index serves on the test split, which the command never saw.

A copy of the untuned index (the default fusion, no correction) is optimized with the train qrels only (`hybrid optimize`, default
budget, in a child process so its peak memory is its own). Test: the start and the published index, each as served
(its own reranker when one was kept), per-query nDCG@10 compared with the paired randomisation test.
"""

from __future__ import annotations

import json
import resource
import shutil
import time

import numpy as np

from bench.harness import Case, Table
from hybrid_retrieval.indexer.corpus import split_queries
from hybrid_retrieval.indexer.manifest import read_manifest
from hybrid_retrieval.indexer.store import RERANKER_DIR
from hybrid_retrieval.quality.significance import randomization_test
from hybrid_retrieval.training.optimize import WORK, own_rerank_spec, served_scores


def _optimize(ctx) -> list[Table]:
    folder = ctx.work / "indexes" / f"{ctx.data.name}-optimized"
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(ctx.untuned_index, folder)
    started = time.perf_counter()
    smoke = ["--steps", "fusion,hubness", "--budget", "5"] if ctx.quick else []  # no training: minutes, not an hour
    ctx.hybrid("optimize", folder, *ctx.train, "--quiet", *smoke)
    seconds = time.perf_counter() - started
    peak_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # the largest child: the command
    report = json.loads((folder / WORK / "report.json").read_text())

    steps = [
        {
            "step": s["name"],
            "decision": s["decision"],
            "held-out before": s["before"],
            "held-out after": s["after"],
            "p": s["p_value"],
            "wins/ties/losses": "/".join(map(str, s["wins_ties_losses"])) if s["wins_ties_losses"] else "",
            "s": round(s["seconds"]),
            "peak RSS MiB": round(s["peak_rss_mib"]),
            "plan": ", ".join(f"{k} {v}" for k, v in s["plan"].items() if k in ("epochs", "examples_per_epoch", "groups_per_epoch")),
        }
        for s in report["steps"]
    ]
    queries, qrels = split_queries(ctx.data, "test")
    start = served_scores(ctx.untuned_index, queries, qrels)
    own = folder / RERANKER_DIR
    final = served_scores(folder, queries, qrels, own if own.is_dir() else None)
    qids = sorted(start)
    a, b = np.array([final[q] for q in qids]), np.array([start[q] for q in qids])
    manifest = read_manifest(folder)
    served = manifest.defaults.merge(own_rerank_spec(own)) if own.is_dir() else manifest.defaults
    test = [
        {
            "pipeline": "start: untuned hybrid (the default fusion)",
            "nDCG@10": round(float(b.mean()), 4),
            "change": "",
            "p": "",
        },
        {
            "pipeline": f"optimized, as served: {served.to_string()}" + (" with its own reranker" if own.is_dir() else ""),
            "nDCG@10": round(float(a.mean()), 4),
            "change": round(float(a.mean() - b.mean()), 4),
            "p": round(randomization_test(a, b), 4),
        },
    ]
    cost = [
        {
            "budget min": round(report["budget_seconds"] / 60),
            "steps min": round(report["spent_seconds"] / 60, 1),
            "command min": round(seconds / 60, 1),
            "peak RSS MiB": round(peak_mib),
            "judged train queries": report["split"]["judged_queries"],
            "fit / held out": f"{report['split']['fit_queries']} / {report['split']['held_out_queries']}",
            "published": "yes" if report["published"].startswith("published") else "no",
        }
    ]
    return [
        Table(
            "each step on the held-out part of the train queries",
            steps,
            f"A step is kept when it beats the state before it at p < {report['held_out']['alpha']} (paired randomisation "
            "test). s and peak RSS: the step's wall time and the command's peak resident memory after it.",
        ),
        Table("the published index on the test split, which the command never saw", test, "p: paired two-sided randomisation test."),
        Table("time and memory of the default budget on this machine", cost, "command min: the whole command, start to publish."),
    ]


CASES = [
    Case(
        "Quality",
        "Optimize",
        "`hybrid optimize` with the train qrels and its default budget: each step on held-out train queries, time and peak "
        "memory, and the published index on test",
        _optimize,
    )
]
