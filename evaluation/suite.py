"""Evaluate pipelines on one or more BEIR datasets: build or reuse indexes, tune on train/dev, run,
score, compare against BM25, and write reports. Runs are cached by content, so an interrupted or
repeated evaluation only computes what changed.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from evaluation.metrics import per_query_scores
from evaluation.report import (
    compare_to_baseline,
    first_stage_table,
    markdown_table,
    plot_charts,
    write_trec_run,
)
from evaluation.runner import (
    CachedScorer,
    RerankChoice,
    doc_ids,
    hubness_pipelines,
    parse_pipeline,
    run_queries,
    tuned_pipelines,
)
from evaluation.tuning import tune_index
from indexer.corpus import split_queries
from indexer.store import open_index
from models.cross_encoder import load_cross_encoder, rerank_weight, training_record
from search.hubness import hubness_stats, k_occurrence
from search.ranking import Ranking
from search.rerank import DEFAULT_RERANK_DEPTH, Reranker, RerankOptions

logger = logging.getLogger(__name__)

TUNING_SPLITS = ("train", "dev")


@dataclass(frozen=True)
class EvalConfig:
    split: str = "test"
    pipelines: tuple[str, ...] = ("bm25", "dense", "hybrid")
    all_fusions: bool = False
    all_hubness: bool = False
    tune: bool = True
    k: int = 100
    progress: bool = True
    reranker: str | None = None  # for `+rerank` pipelines: a cross-encoder folder or name
    rerank_depth: int = DEFAULT_RERANK_DEPTH


def tune_on_labelled_split(index_dir: Path, dataset: Path, eval_split: str, progress: bool) -> str | None:
    """Tune the fusion on the dataset's train (else dev) split unless already tuned; never on `eval_split`."""
    if open_index(index_dir, verify="none").manifest["fusion"].get("tuning"):
        return None
    for split in TUNING_SPLITS:
        if split != eval_split and (dataset / "qrels" / f"{split}.tsv").is_file():
            queries, qrels = split_queries(dataset, split)
            tune_index(index_dir, queries, qrels, dataset / "qrels" / f"{split}.tsv", progress=progress)
            return split
    return None


def _cache_key(manifest: dict, spec: str, queries: dict, k: int, reranker: dict | None = None) -> str:
    """Everything a run depends on: index files, its default fusion and hubness, pipeline, queries, depth, reranker."""
    signature = {"files": {f: v["sha256"] for f, v in manifest["files"].items()}, "fusion": manifest["fusion"].get("default"),
                 "hubness": manifest.get("hubness", {}).get("params"), "spec": spec, "queries": sorted(queries.items()), "k": k,
                 "reranker": reranker}
    return hashlib.sha256(json.dumps(signature, sort_keys=True).encode()).hexdigest()[:24]


def _cached_run(cache: Path | None, key: str, compute):
    path = cache / f"{key}.json" if cache else None
    if path and path.is_file():
        stored = json.loads(path.read_text())
        return stored["run"], [Ranking(np.asarray(r, dtype=np.int64), np.zeros(len(r))) for r in stored["rankings"]]
    run, rankings = compute()
    if path:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"run": run, "rankings": [r.doc_idx.tolist() for r in rankings]}))
        tmp.replace(path)
    return run, rankings


class _Rerankers:
    """One cross-encoder per precision, loaded on first use and sharing scores across pipelines."""

    def __init__(self, config: EvalConfig, index):
        self.config, self.index, self._loaded = config, index, {}
        # read once: what the model was trained on and the weight it was tuned to (1 when untuned)
        record = training_record(config.reranker) if config.reranker else None
        self.trained_on = (record or {}).get("data", {}).get("split")
        self.default_weight = rerank_weight(config.reranker) if config.reranker else 1.0

    def identity(self, choice: RerankChoice | None) -> dict | None:
        if choice is None:
            return None
        model = self.get(choice).options.model.model
        return {"config": getattr(model, "config", None), "precision": choice.precision, "depth": self.config.rerank_depth,
                "weight": self.weight(choice)}

    def weight(self, choice: RerankChoice) -> float:
        return self.default_weight if choice.weight is None else choice.weight

    def get(self, choice: RerankChoice | None) -> Reranker | None:
        if choice is None:
            return None
        if not self.config.reranker:
            raise ValueError("`+rerank` pipelines need a reranker: pass --reranker (e.g. a `hybrid train-reranker` folder)")
        if self.trained_on == self.config.split:
            raise ValueError(f"the reranker {self.config.reranker} was trained and tuned on the {self.trained_on!r} split: "
                             "evaluate it on another split")
        if choice.precision not in self._loaded:
            model = CachedScorer(load_cross_encoder(self.config.reranker, precision=choice.precision))
            self._loaded[choice.precision] = Reranker(RerankOptions(model, depth=self.config.rerank_depth), self.index.doc_text)
        return self._loaded[choice.precision]


def evaluate_dataset(dataset: Path, index_dir: Path, config: EvalConfig, out: Path | None = None) -> dict:
    queries, qrels = split_queries(dataset, config.split)
    tuned_on = tune_on_labelled_split(index_dir, dataset, config.split, config.progress) if config.tune else None
    index = open_index(index_dir, verify="size")
    pipeline, ids = index.pipeline(), doc_ids(index)
    specs = list(config.pipelines) + (tuned_pipelines(index.manifest) if config.all_fusions else [])
    specs += hubness_pipelines() if config.all_hubness else []
    cache = None
    if out:
        (out / "runs").mkdir(parents=True, exist_ok=True)
        cache = out / "cache"
        cache.mkdir(exist_ok=True)
    report = {"dataset": dataset.name, "split": config.split, "queries": len(queries), "index": str(index_dir),
              "tuned_on": tuned_on or index.manifest["fusion"].get("tuning", {}).get("qrels"), "pipelines": {}}
    per_query = {}
    rerankers = _Rerankers(config, index)
    for spec in dict.fromkeys(specs):
        mode, fusion, hubness, rerank = parse_pipeline(spec)

        def compute():
            return run_queries(pipeline, ids, queries, mode, fusion=fusion, hubness=hubness, k=config.k, progress=config.progress,
                               reranker=rerankers.get(rerank), rerank_weight=rerankers.weight(rerank) if rerank else None)

        key = _cache_key(index.manifest, spec, queries, config.k, rerankers.identity(rerank))
        run, rankings = _cached_run(cache, key, compute)
        per_query[spec] = per_query_scores(run, qrels)
        report["pipelines"][spec] = {m: round(sum(v.values()) / len(qrels), 4) for m, v in per_query[spec].items()}
        report["pipelines"][spec]["n10_skewness"] = hubness_stats(k_occurrence(rankings, index.num_docs, 10))["skewness"]
        if out:
            write_trec_run(run, out / "runs" / f"{spec.replace(':', '_').replace('+', '_')}.trec", spec)
    index.close()
    baseline = "bm25" if "bm25" in per_query else next(iter(per_query))
    comparison = compare_to_baseline(per_query, baseline)
    for spec, c in comparison.items():
        report["pipelines"][spec].update(p_value_vs_baseline=round(c["p_value"], 4), wins=c["wins"], ties=c["ties"], losses=c["losses"])
    report["baseline"] = baseline
    for spec, vs in first_stage_comparisons(per_query).items():
        report["pipelines"][spec]["vs_first_stage"] = vs
    if out:
        (out / "report.json").write_text(json.dumps(report, indent=2))
        metrics_only = {**report, "pipelines": {s: {m: v for m, v in r.items() if m in per_query[s]} for s, r in report["pipelines"].items()}}
        (out / "report.md").write_text(markdown_table(metrics_only, comparison, baseline)
                                       + "".join(line + "\n" for line in first_stage_table(report["pipelines"])))
        plot_charts(report, comparison, out, baseline)
    return report


def first_stage(spec: str) -> str:
    """`X+rerank...` -> `X` (the other `+` extras kept, in their order)."""
    return "+".join(part for part in spec.split("+") if part.partition(":")[0] != "rerank")


def first_stage_comparisons(per_query: dict[str, dict[str, dict[str, float]]], metric: str = "ndcg@10") -> dict[str, dict]:
    """What reranking added: each evaluated reranked pipeline against its own first stage, when that was evaluated too."""
    out = {}
    for spec in per_query:
        stage = first_stage(spec)
        if stage == spec or stage not in per_query:
            continue
        c = compare_to_baseline({stage: per_query[stage], spec: per_query[spec]}, stage, metric)[spec]
        delta = np.mean(list(per_query[spec][metric].values())) - np.mean(list(per_query[stage][metric].values()))
        out[spec] = {"first_stage": stage, f"{metric}_delta": round(float(delta), 4), "p_value": round(c["p_value"], 4),
                     **{k: c[k] for k in ("wins", "ties", "losses")}}
    return out


def summary_table(reports: list[dict], metric: str = "ndcg@10") -> str:
    """One column per dataset and an average over datasets, for pipelines present in all of them."""
    specs = [s for s in reports[0]["pipelines"] if all(s in r["pipelines"] for r in reports)]
    lines = ["| pipeline | " + " | ".join(r["dataset"] for r in reports) + " | average |", "|---|" + "---:|" * (len(reports) + 1)]
    for spec in specs:
        values = [r["pipelines"][spec][metric] for r in reports]
        lines.append(f"| {spec} | " + " | ".join(f"{v:.4f}" for v in values) + f" | {np.mean(values):.4f} |")
    return f"{metric} on the {reports[0]['split']} split\n\n" + "\n".join(lines) + "\n"
