"""Evaluate pipelines on one or more BEIR datasets: build or reuse indexes, tune on train/dev, run,
score, compare against BM25, and write reports. Runs are cached by content, so an interrupted or
repeated evaluation only computes what changed.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from hybrid_retrieval.common.errors import ConfigError
from hybrid_retrieval.evaluation.report import (
    baseline_index_table,
    compare_to_baseline,
    first_stage_table,
    markdown_table,
    plot_charts,
    write_trec_run,
)
from hybrid_retrieval.evaluation.runner import Pipeline, hubness_pipelines, parse_pipeline, run_queries, tuned_pipelines
from hybrid_retrieval.indexer.build import BuildOptions, build_index
from hybrid_retrieval.indexer.corpus import split_queries
from hybrid_retrieval.indexer.manifest import MANIFEST, Manifest, read_manifest
from hybrid_retrieval.indexer.store import RERANKER_DIR, OpenIndex, open_index
from hybrid_retrieval.models.cross_encoder import CachingCrossEncoder, load_cross_encoder, rerank_weight, training_record
from hybrid_retrieval.models.onnx_export import ONNX_SUBDIR
from hybrid_retrieval.quality.metrics import per_query_scores
from hybrid_retrieval.search.hubness import hubness_stats, k_occurrence
from hybrid_retrieval.search.pipeline import SearchPipeline
from hybrid_retrieval.search.ranking import Ranking
from hybrid_retrieval.search.rerank import DEFAULT_RERANK_DEPTH
from hybrid_retrieval.training.fusion import tune_fusion_on_index

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
    filter: dict | None = None  # every pipeline searches only the documents it admits (search.filters)
    query_precision: str = "auto"  # as the service's HYBRID_QUERY_PRECISION (models.onnx_export.resolve_precision)
    baseline_index: Path | None = None  # every pipeline also runs there and is compared (e.g. before `hybrid reembed`)


def tune_on_labelled_split(index_dir: Path, dataset: Path, eval_split: str, progress: bool, query_precision: str = "auto") -> str | None:
    """Tune the fusion on the dataset's train (else dev) split unless already tuned; never on `eval_split`."""
    if read_manifest(index_dir).fusion_tuning:
        return None
    for split in TUNING_SPLITS:
        if split != eval_split and (dataset / "qrels" / f"{split}.tsv").is_file():
            queries, qrels = split_queries(dataset, split)
            tune_fusion_on_index(
                index_dir, queries, qrels, dataset / "qrels" / f"{split}.tsv", progress=progress, query_precision=query_precision
            )
            return split
    return None


def _cache_key(manifest: Manifest, spec: dict, queries: dict, k: int, reranker: dict | None = None, query_precision: str = "fp32") -> str:
    """Everything a run depends on: index files, hubness fit, the resolved spec, queries, depth, reranker, the
    weights that embedded the queries."""
    signature = {
        "files": {f: v["sha256"] for f, v in manifest.files.items()},
        "query_precision": query_precision,
        "hubness": asdict(manifest.hubness.params) if manifest.hubness else None,
        "spec": spec,
        "queries": sorted(queries.items()),
        "k": k,
        "reranker": reranker,
    }
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


class _Pipelines:
    """The index's search pipeline, and one per reranker precision (loaded on first use), whose cross-encoder
    scores are shared across evaluated pipelines; the reranker's defaults are its tuned weight and
    `rerank_depth`, as the service would serve it."""

    def __init__(self, config: EvalConfig, index: OpenIndex):
        self.config, self.index, self.plain = config, index, index.pipeline()
        self._reranking: dict[str, SearchPipeline] = {}
        own = index.path / RERANKER_DIR  # the index's own (`hybrid optimize`), served when the service names none
        self.reranker = config.reranker or (str(own) if (own / ONNX_SUBDIR).is_dir() else None)
        record = training_record(self.reranker) if self.reranker else None
        self.trained_on = (record or {}).get("data", {}).get("split")  # what the model was trained and tuned on

    def get(self, pipeline: Pipeline) -> SearchPipeline:
        if not pipeline.reranks:
            return self.plain
        if not self.reranker:
            raise ConfigError(
                "`+rerank` pipelines need a reranker: pass --reranker (e.g. a `hybrid train-reranker` folder), or optimize the index"
            )
        if self.trained_on == self.config.split:
            raise ConfigError(
                f"the reranker {self.reranker} was trained and tuned on the {self.trained_on!r} split: evaluate it on another split"
            )
        if pipeline.precision not in self._reranking:
            model = CachingCrossEncoder(load_cross_encoder(self.reranker, precision=pipeline.precision))
            defaults = {"rerank": {"depth": self.config.rerank_depth, "weight": rerank_weight(self.reranker)}}
            self._reranking[pipeline.precision] = self.index.pipeline(defaults, cross_encoder=model)
        return self._reranking[pipeline.precision]

    def identity(self, pipeline: Pipeline) -> dict | None:
        if not pipeline.reranks:
            return None
        reranker = self.get(pipeline).reranker
        assert reranker is not None  # a reranking pipeline's search holds its cross-encoder
        return {"config": getattr(reranker.model.model, "config", None), "precision": pipeline.precision}


def evaluate_dataset(dataset: Path, index_dir: Path, config: EvalConfig, out: Path | None = None) -> dict:
    queries, qrels = split_queries(dataset, config.split)
    tuned_on = tune_on_labelled_split(index_dir, dataset, config.split, config.progress, config.query_precision) if config.tune else None
    index = open_index(index_dir, verify="size", query_precision=config.query_precision)
    names = list(config.pipelines) + (tuned_pipelines(index.manifest) if config.all_fusions else [])
    names += hubness_pipelines() if config.all_hubness else []
    cache = None
    if out:
        (out / "runs").mkdir(parents=True, exist_ok=True)
        cache = out / "cache"
        cache.mkdir(exist_ok=True)
    tuning = index.manifest.fusion_tuning
    report: dict[str, Any] = {
        "dataset": dataset.name,
        "split": config.split,
        "queries": len(queries),
        "index": str(index_dir),
        "tuned_on": tuned_on or (tuning.qrels if tuning else None),
        "defaults": index.manifest.defaults.to_dict(),
        "filter": config.filter,
        "pipelines": {},
        "specs": {},
    }
    per_query = {}
    pipelines = _Pipelines(config, index)
    for name in dict.fromkeys(names):
        spec, run, rankings, per_query[name] = _score(pipelines, name, config, queries, qrels, cache)
        report["specs"][name] = spec
        report["pipelines"][name] = {m: round(sum(v.values()) / len(qrels), 4) for m, v in per_query[name].items()}
        report["pipelines"][name]["n10_skewness"] = hubness_stats(k_occurrence(rankings, index.num_docs, 10))["skewness"]
        if out:
            write_trec_run(run, out / "runs" / f"{name.replace(':', '_').replace('+', '_').replace('@', '_')}.trec", name)
    index.close()
    if config.baseline_index:
        report["baseline_index"] = _against_baseline_index(config.baseline_index, config, queries, qrels, cache, per_query)
    _compare(report, per_query, out)
    return report


def _compare(report: dict[str, Any], per_query: dict, out: Path | None) -> None:
    """Each pipeline against the baseline (BM25 when evaluated) and each reranked one against its first stage, into
    `report`; with `out`, the report written there as JSON, a Markdown table and charts."""
    baseline = "bm25" if "bm25" in per_query else next(iter(per_query))
    comparison = compare_to_baseline(per_query, baseline)
    for spec, c in comparison.items():
        report["pipelines"][spec].update(p_value_vs_baseline=round(c["p_value"], 4), wins=c["wins"], ties=c["ties"], losses=c["losses"])
    report["baseline"] = baseline
    for name, vs in first_stage_comparisons(per_query).items():
        report["pipelines"][name]["vs_first_stage"] = vs
    if out:
        (out / "report.json").write_text(json.dumps(report, indent=2))
        metrics_only = {
            **report,
            "pipelines": {s: {m: v for m, v in r.items() if m in per_query[s]} for s, r in report["pipelines"].items()},
        }
        (out / "report.md").write_text(
            markdown_table(metrics_only, comparison, baseline)
            + "".join(line + "\n" for line in first_stage_table(report["pipelines"]) + baseline_index_table(report.get("baseline_index")))
        )
        plot_charts(report, comparison, out, baseline)


def _score(pipelines: _Pipelines, name: str, config: EvalConfig, queries: dict, qrels: dict, cache: Path | None):
    """One pipeline's resolved spec, run (cached), rankings and per-query metrics on `pipelines.index`."""
    index = pipelines.index
    pipeline = parse_pipeline(name)
    if config.filter is not None:
        pipeline = replace(pipeline, spec={**pipeline.spec, "filter": config.filter})
    search = pipelines.get(pipeline)
    spec = search.resolve(pipeline.spec).to_dict()
    key = _cache_key(index.manifest, spec, queries, config.k, pipelines.identity(pipeline), index.query_precision)
    run, rankings = _cached_run(
        cache, key, lambda: run_queries(search, index.doc_ids, queries, pipeline.spec, config.k, config.progress, name)
    )
    return spec, run, rankings, per_query_scores(run, qrels)


def _against_baseline_index(
    baseline_index: Path, config: EvalConfig, queries: dict, qrels: dict, cache: Path | None, per_query: dict, metric: str = "ndcg@10"
) -> dict:
    """Each pipeline run on `baseline_index` too (its own defaults: its tuned fusion; the same reranker), and the
    paired randomisation test of this index's row against that one."""
    index = open_index(baseline_index, verify="size", query_precision=config.query_precision)
    pipelines = _Pipelines(config, index)
    rows = {}
    for name in per_query:
        *_, base = _score(pipelines, name, config, queries, qrels, cache)
        rows[name] = {
            "baseline": {m: round(sum(v.values()) / len(qrels), 4) for m, v in base.items()},
            **paired_change(base, per_query[name], metric),
        }
    model = index.manifest.embedder
    index.close()
    return {"index": str(baseline_index), "model": model.model, "model_checksum": model.model_checksum, "pipelines": rows}


def paired_change(before: dict, after: dict, metric: str = "ndcg@10") -> dict:
    """`after`'s change in mean `metric` over `before` (per-query scores of the same queries), the paired randomisation
    test's p-value and the per-query wins/ties/losses."""
    c = compare_to_baseline({"before": before, "after": after}, "before", metric)["after"]
    delta = np.mean(list(after[metric].values())) - np.mean(list(before[metric].values()))
    return {f"{metric}_delta": round(float(delta), 4), "p_value": round(c["p_value"], 4), **{k: c[k] for k in ("wins", "ties", "losses")}}


def first_stage_comparisons(per_query: dict[str, dict[str, dict[str, float]]], metric: str = "ndcg@10") -> dict[str, dict]:
    """What reranking added: each evaluated reranked pipeline against its own first stage, when that was evaluated too."""
    out = {}
    for spec in per_query:
        stage = parse_pipeline(spec).first_stage
        if stage is None or stage not in per_query:
            continue
        out[spec] = {"first_stage": stage, **paired_change(per_query[stage], per_query[spec], metric)}
    return out


def summary_table(reports: list[dict], metric: str = "ndcg@10") -> str:
    """One column per dataset and an average over datasets, for pipelines present in all of them."""
    specs = [s for s in reports[0]["pipelines"] if all(s in r["pipelines"] for r in reports)]
    lines = ["| pipeline | " + " | ".join(r["dataset"] for r in reports) + " | average |", "|---|" + "---:|" * (len(reports) + 1)]
    for spec in specs:
        values = [r["pipelines"][spec][metric] for r in reports]
        lines.append(f"| {spec} | " + " | ".join(f"{v:.4f}" for v in values) + f" | {np.mean(values):.4f} |")
    return f"{metric} on the {reports[0]['split']} split\n\n" + "\n".join(lines) + "\n"


def evaluate_datasets(
    datasets: list[Path], config: EvalConfig, index_dir: Path | None = None, out: Path | None = None, build: BuildOptions = BuildOptions()
) -> list[dict]:
    """Evaluate each dataset on its index (`index_dir`, or indexes/<dataset>, built with `build` when
    missing); with `out`, write each dataset's artefacts under out/<dataset> and the summary beside them."""
    if index_dir and len(datasets) > 1:
        raise ConfigError("--index names one index; with several datasets each gets indexes/<dataset>")
    reports = []
    for dataset in datasets:
        folder = index_dir or Path("indexes") / dataset.name
        if not (folder / MANIFEST).is_file():
            build_index(dataset, folder, build)
        reports.append(evaluate_dataset(dataset, folder, config, out / dataset.name if out else None))
    if out:
        (out / "summary.md").write_text(summary_table(reports))
        (out / "summary.json").write_text(json.dumps(reports, indent=2))
    return reports
