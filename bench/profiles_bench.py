"""Encoder profiles side by side: how fast each embeds documents (the cost of a build, a reembed, a bulk load), what
each costs in ranking quality on the test split, with the fusion tuned for each on train, and what each does to
query latency, serving throughput and the index's size.

Profiles: `full` (the transformer, the default), `small` (a 3-layer student distilled from it on the dataset's own text:
`hybrid distil`, made once by `python -m bench prepare`, then `--model STUDENT`) and `fast` (a static model distilled
from it: `--profile fast`), the transformers at fp32 and int8 (`--precision int8`). The embedding rates alternate
profile by profile, round after round, over the same documents, so machine noise hits all alike.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from bench.harness import Case, Table, compare, interleaved, percentiles
from bench.loadgen import closed_loop
from hybrid_retrieval.evaluation.server import running_server
from hybrid_retrieval.indexer.corpus import read_corpus
from hybrid_retrieval.indexer.leftovers import folder_bytes
from hybrid_retrieval.indexer.manifest import read_manifest
from hybrid_retrieval.indexer.store import MODEL_DIR, open_index
from hybrid_retrieval.models.embedder import OnnxEmbedder

PIPELINES = ("dense", "hybrid")
METRICS = ("ndcg@10", "recall@100")
CLIENTS = 16


def _embedding_rates(ctx, indexes: dict[str, Path], texts: list[str]) -> dict[str, list[float]]:
    """Documents per second of each profile (the models of `indexes`, by profile), one sample per round."""
    embedders = {}
    for name, folder in indexes.items():
        precisions = ("fp32", "int8") if (folder / MODEL_DIR / "model.int8.onnx").is_file() else ("fp32",)
        for precision in precisions:
            embedders[name + (" int8" if precision == "int8" else "")] = OnnxEmbedder(folder / MODEL_DIR, precision=precision)
    rounds = ctx.size(5, 2)
    times = interleaved({name: lambda batch, e=e: e.encode(batch) for name, e in embedders.items()}, [texts] * rounds, warmup=1)
    return {name: [len(texts) * 1000 / ms for ms in values] for name, values in times.items()}


def _compare(ctx, index: Path, baseline: Path, out: Path, reranker: Path | None) -> dict:
    pipelines = [*PIPELINES, *(["hybrid+rerank"] if reranker else [])]
    flags = ["--reranker", reranker] if reranker else []
    ctx.hybrid(
        "eval", "--data", ctx.data, "--split", "test", "--index", index, "--baseline-index", baseline, "--no-tune",
        "--pipelines", ",".join(pipelines), *flags, "--out", out, "--quiet",
    )  # fmt: skip
    return json.loads((out / ctx.data.name / "report.json").read_text())


def _quality_rows(profile: str, defaults: str, report: dict) -> list[dict]:
    rows = []
    for pipeline, row in report["pipelines"].items():
        versus = report["baseline_index"]["pipelines"][pipeline]
        rows.append(
            {
                "profile": profile,
                "defaults": defaults,
                "pipeline": pipeline,
                **{f"{m} full": versus["baseline"][m] for m in METRICS},
                **{f"{m} profile": row[m] for m in METRICS},
                "nDCG@10 change": versus["ndcg@10_delta"],
                "p": versus["p_value"],
                "wins/ties/losses": f"{versus['wins']}/{versus['ties']}/{versus['losses']}",
            }
        )
    return rows


def _latencies(indexes: dict[str, Path], queries: list[str]) -> dict[str, list[float]]:
    """In-process milliseconds per query of each profile's query embedding, dense and hybrid search (k=10)."""
    opened = {name: open_index(folder, verify="size") for name, folder in indexes.items()}
    try:
        calls = {}
        for name, index in opened.items():
            pipeline = index.pipeline()
            calls[f"{name} embed"] = lambda q, e=index.query_embedder: e.encode([q])
            for mode in ("dense", "hybrid"):
                calls[f"{name} {mode}"] = lambda q, p=pipeline, mode=mode: p.search(q, 10, {"mode": mode})
        return interleaved(calls, queries)
    finally:
        for index in opened.values():
            index.close()


def _throughput(indexes: dict[str, Path], queries: list[str], seconds: float, rounds: int) -> dict[str, list[float]]:
    """Requests per second of CLIENTS closed-loop clients searching (hybrid, k=10) each profile's service, the services
    taking turns round after round (one at a time on the machine)."""
    bodies = [json.dumps({"query": q, "k": 10}).encode() for q in queries]
    served: dict[str, list[float]] = {name: [] for name in indexes}
    for _ in range(rounds):
        for name, folder in indexes.items():
            with running_server(folder, {"HYBRID_VERIFY": "size"}) as (url, _):
                closed_loop(url, bodies[:CLIENTS], CLIENTS, CLIENTS * 4, seconds)  # warm
                result = closed_loop(url, bodies, CLIENTS, 10**9, seconds)
                served[name].append(result["throughput_rps"])
    return served


def _profiles(ctx) -> list[Table]:
    root = ctx.work / "profiles"
    built = {
        "small": (root / f"{ctx.data.name}-small", ["--model", ctx.student, "--profile", "small"]),
        "fast": (root / f"{ctx.data.name}-fast", ["--profile", "fast"]),
    }
    for folder, flags in built.values():
        if not (folder / "manifest.json").is_file():
            ctx.hybrid("index", ctx.data, "--out", folder, *flags, "--quiet")
    full = ctx.untuned_index
    indexes = {"full": full, **{name: folder for name, (folder, _) in built.items()}}
    reranker = ctx.made_reranker()

    texts = [doc.indexed_text for doc, _ in zip(read_corpus(ctx.data), range(ctx.size(128, 16)), strict=False)]
    rates = _embedding_rates(ctx, indexes, texts)
    speed = []
    for name, values in rates.items():
        per_s = statistics.median(values)
        versus = compare(values, rates["full"], higher_is_better=True)
        speed.append(
            {
                "profile": name,
                "documents/s": round(per_s, 1),
                "minutes per 100k documents": round(100_000 / per_s / 60, 1),
                "rate vs full": versus["ratio"],
                "p": versus["p"],
            }
        )

    quality = []
    tuned = {name: ctx.tuned_copy(folder) for name, folder in indexes.items()}
    for name in built:
        quality += _quality_rows(
            name, "untuned (the default fusion)", _compare(ctx, indexes[name], full, root / "eval" / f"{name}-untuned", None)
        )
        quality += _quality_rows(
            name, "both tuned on train", _compare(ctx, tuned[name], tuned["full"], root / "eval" / f"{name}-tuned", reranker)
        )

    queries = ctx.queries()[: ctx.size(200, 10)]
    times = _latencies(tuned, queries)
    served = _throughput(tuned, ctx.queries(), ctx.size(15, 3), ctx.size(2, 1))
    serving = []
    for name, folder in tuned.items():
        manifest = read_manifest(folder)
        serving.append(
            {
                "profile": name,
                "dimension": manifest.embedder.dimension,
                "index MiB": round(folder_bytes(folder) / 2**20, 1),
                "model MiB": round(folder_bytes(folder / MODEL_DIR) / 2**20, 1),
                "build s": manifest.build.get("total_s"),
                "query embedding p50 ms": percentiles(times[f"{name} embed"])["p50_ms"],
                "dense p50 ms": percentiles(times[f"{name} dense"])["p50_ms"],
                "hybrid p50 ms": percentiles(times[f"{name} hybrid"])["p50_ms"],
                f"hybrid req/s at {CLIENTS} clients": round(statistics.median(served[name]), 1),
            }
        )
    ratios = {name: compare(served[name], served["full"], higher_is_better=True) for name in built}
    student = read_manifest(indexes["small"]).embedder.recipe or {}
    made = f"{student.get('texts', {}).get('training')} texts, {student.get('recipe', {}).get('epochs')} epochs"
    rerank_note = (
        "hybrid+rerank: the trained reranker over each profile's tuned hybrid."
        if reranker
        else "No hybrid+rerank row: the trained reranker (`python -m bench prepare`) was not made before this run."
    )
    return [
        Table(
            "document embedding rate per profile (what a build, a reembed and a bulk load spend most of their time on)",
            speed,
            f"{len(texts)} {ctx.data.name} documents a round, {len(rates['full'])} rounds alternating the profiles; "
            "p: Mann-Whitney over the rounds' rates.",
        ),
        Table(
            "quality of the small and fast profiles against full, test split",
            quality,
            "p: paired two-sided randomisation test of per-query nDCG@10. Tuned: `hybrid tune` on the train split, for each "
            f"profile's own scores. {rerank_note} The small profile's student was distilled on {student.get('device')} in "
            f"{student.get('seconds')} s ({made}).",
        ),
        Table(
            "query latency, serving throughput and size per profile (tuned indexes)",
            serving,
            f"In process: {len(queries)} test queries, k=10, the profiles alternating query by query. Throughput: "
            f"{CLIENTS} closed-loop HTTP clients on loopback, hybrid k=10, the services taking turns; "
            + "; ".join(f"{name} / full {r['ratio']} (p {r['p']})" for name, r in ratios.items())
            + ". build s: each index's whole build (not side by side; a small index's excludes the distillation).",
        ),
    ]


CASES = [
    Case(
        "Models",
        "Encoder profiles",
        "full, small (a 3-layer student distilled on the corpus) and fast (a static model distilled from it and aligned "
        "to it on the corpus), at fp32 and int8: embedding rate side by side, test quality with the fusion tuned for "
        "each, query latency, 16-client throughput, size",
        _profiles,
    )
]
