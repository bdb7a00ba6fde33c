"""Choose the fusion for an index on labelled training queries.

Candidates (both raw scores for the union of both top-depth lists) are retrieved once per query;
every configuration is then a cheap re-fusion. Convex combination is swept over alpha for every
normalisation, RRF over rrf_k. The best configuration becomes the index's default only if choosing
it beats the untuned default (equal-weight z-scores) on held-out queries, significantly: 5-fold
cross-validation picks the configuration on four folds and scores it on the fifth, so the comparison is
not in-sample, and the paired randomisation test of those scores against the default's must give
p < SIGNIFICANCE_LEVEL (a small gain of one configuration among hundreds is as likely to be luck). The
queries passed in are the only ones looked at: keep test queries out.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
from tqdm import tqdm

from hybrid_retrieval.indexer.manifest import FusionTuning, Manifest, update_manifest
from hybrid_retrieval.indexer.store import open_index
from hybrid_retrieval.quality.metrics import chosen_out_of_sample, evaluate, out_of_sample_scores, per_query_scores
from hybrid_retrieval.quality.significance import SIGNIFICANCE_LEVEL, randomization_test
from hybrid_retrieval.quality.splits import refuse_test_split
from hybrid_retrieval.search.fusion import RRF, ConvexCombination, Fusion, fuse, fusion_from_dict, fusion_to_dict, fusion_to_string
from hybrid_retrieval.search.normalize import NORMALIZERS
from hybrid_retrieval.search.pipeline import SearchPipeline
from hybrid_retrieval.search.spec import PassageSpec, SearchSpec
from hybrid_retrieval.training.fields import tune_text_fields
from hybrid_retrieval.training.passages import tune_passage_scoring
from hybrid_retrieval.training.pseudo import generate, source_name

logger = logging.getLogger(__name__)

ALPHAS = tuple(round(float(a), 2) for a in np.linspace(0.0, 1.0, 21))
FOLDS = 5
RRF_KS = (1, 2, 5, 10, 20, 30, 40, 60, 80, 100, 150, 200, 500)


@dataclass
class TuningResult:
    metric: str
    queries: int
    table: list[dict]  # one row per configuration: its fusion dict and its metric value
    singles: dict[str, float]  # the metric of each retriever alone
    per_query: list[dict[str, float]]  # aligned with `table`: each configuration's metric for each query

    def best(self, family: str | None = None, norm: str | None = None) -> dict:
        rows = [r for r in self.table if (family is None or r["method"] == family) and (norm is None or r.get("norm") == norm)]
        return max(rows, key=lambda r: r[self.metric])  # first of equals: the grid order is deterministic

    def best_fusion(self) -> Fusion:
        return fusion_from_dict({k: v for k, v in self.best().items() if k != self.metric})

    def value_of(self, fusion: Fusion) -> float:
        return float(self.table[self._row_of(fusion)][self.metric])

    def scores_of(self, fusion: Fusion) -> np.ndarray:
        """Each query's metric under `fusion`, in sorted query id order (as `out_of_sample_scores`)."""
        row = self.per_query[self._row_of(fusion)]
        return np.array([row[q] for q in sorted(row)])

    def swept(self, fusion: Fusion) -> bool:
        return self._find(fusion) is not None

    def _row_of(self, fusion: Fusion) -> int:
        row = self._find(fusion)
        if row is None:
            raise KeyError(f"{fusion_to_string(fusion)} is not in the tuning table")
        return row

    def _find(self, fusion: Fusion) -> int | None:
        return next((i for i, row in enumerate(self.table) if fusion_from_dict(_fusion_fields(row, self.metric)) == fusion), None)

    def cross_validated(self, folds: int = FOLDS) -> float:
        """The metric of tuning itself, out of sample (see quality.metrics.chosen_out_of_sample)."""
        return chosen_out_of_sample(self.per_query, folds)

    def cross_validated_scores(self, folds: int = FOLDS) -> np.ndarray:
        return out_of_sample_scores(self.per_query, folds)


def _fusion_fields(row: dict, metric: str) -> dict:
    return {k: v for k, v in row.items() if k != metric}


def grid() -> list[Fusion]:
    configs: list[Fusion] = [ConvexCombination(alpha=a, norm=n) for n in NORMALIZERS for a in ALPHAS]
    return configs + [RRF(rrf_k=float(k)) for k in RRF_KS]


def tune_fusion(
    pipeline: SearchPipeline,
    doc_ids: list[str],
    queries: dict[str, str],
    qrels: dict[str, dict[str, int]],
    metric: str = "ndcg@10",
    k: int = 100,
    progress: bool = True,
) -> TuningResult:
    # fusion is tuned on uncorrected dense scores, whatever hubness the index has
    depth = pipeline.defaults.depth
    candidates = {
        qid: pipeline.candidates(text, depth)[0] for qid, text in tqdm(queries.items(), desc="candidates", unit=" q", disable=not progress)
    }
    table, per_query = [], []
    for fusion in tqdm(grid(), desc="configurations", disable=not progress):
        run = {}
        for qid, cands in candidates.items():
            ranking = fuse(cands, fusion).ranking().head(k)
            run[qid] = {doc_ids[i]: float(s) for i, s in zip(ranking.doc_idx, ranking.scores)}
        per_query.append(per_query_scores(run, qrels, (metric,))[metric])
        table.append({**fusion_to_dict(fusion), metric: sum(per_query[-1].values()) / len(qrels)})
    singles = {}
    for mode in ("bm25", "dense"):
        single = pipeline.resolve({"mode": mode, "hubness": {"method": "none"}, "rerank": {"enabled": False}})
        run = {}
        for qid, text in queries.items():
            ranking = pipeline.search(text, k=k, spec=single).ranking
            run[qid] = {doc_ids[i]: float(s) for i, s in zip(ranking.doc_idx, ranking.scores)}
        singles[mode] = evaluate(run, qrels, (metric,))[metric]
    return TuningResult(metric, len(queries), table, singles, per_query)


def plot(result: TuningResult, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for norm in NORMALIZERS:
        rows = [r for r in result.table if r.get("norm") == norm]
        ax.plot([r["alpha"] for r in rows], [r[result.metric] for r in rows], marker=".", label=f"cc {norm}")
    rrf_best = result.best("rrf")
    ax.axhline(rrf_best[result.metric], color="black", linestyle="--", label=f"rrf (rrf_k={rrf_best['rrf_k']:g})")
    for mode, style in (("bm25", ":"), ("dense", "-.")):
        ax.axhline(result.singles[mode], color="grey", linestyle=style, label=f"{mode} alone")
    ax.set_xlabel("alpha (weight of dense)")
    ax.set_ylabel(f"{result.metric} ({result.queries} training queries)")
    ax.set_title("Convex-combination fusion against alpha")
    ax.legend(loc="lower center", ncol=3, fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def format_table(result: TuningResult) -> str:
    m = result.metric
    rows = [(f"cc {norm} (best alpha {result.best('cc', norm)['alpha']:.2f})", result.best("cc", norm)[m]) for norm in NORMALIZERS]
    best_rrf = result.best("rrf")
    rows += [("rrf (rrf_k 60)", result.value_of(RRF())), (f"rrf (best rrf_k {best_rrf['rrf_k']:g})", best_rrf[m])]
    rows += [(f"{mode} alone", value) for mode, value in result.singles.items()]
    return "\n".join([f"{'configuration (in-sample)':<36}{m:>10}"] + [f"{name:<36}{value:>10.4f}" for name, value in rows])


def evidence(
    result: TuningResult,
    qrels_path: Path | str,
    untuned: Fusion = SearchSpec().fusion,
    level: float | None = SIGNIFICANCE_LEVEL,
    served: Fusion | None = None,
) -> dict:
    """Before/after on held-out queries: the untuned default vs tuning cross-validated, the paired test between them,
    and the decision: tuned when it wins at p < `level`; with `level` None, when it wins at all (for a caller that
    tests the result on queries of its own: hybrid optimize). `served`: the fusion the index served before, shown
    beside them when it is another (an index built before the default changed, or tuned before)."""
    before, after = result.value_of(untuned), result.cross_validated()
    gains = result.cross_validated_scores() - result.scores_of(untuned)
    p = randomization_test(gains, np.zeros_like(gains))
    earlier = {}
    if served is not None and served != untuned and result.swept(served):
        earlier = {f"served before: {fusion_to_string(served)}": result.value_of(served)}
    return {
        "metric": result.metric,
        "queries": result.queries,
        "split": str(qrels_path),
        "folds": FOLDS,
        "values": {
            **earlier,
            f"untuned {fusion_to_string(untuned)}": before,
            "tuned, cross-validated": after,
            f"tuned {fusion_to_string(result.best_fusion())}, in-sample": result.best()[result.metric],
        },
        "p": round(p, 4),
        # a gain is a mean of per-query differences above rounding (two orders of summation differ in the last bits)
        "decision": "tuned" if gains.mean() > 1e-12 and (level is None or p < level) else "kept untuned",
    }


def pseudo_split(
    index_dir: Path, recipe: str, max_queries: int, filter_depth: int, query_precision: str = "auto", progress: bool = True
) -> tuple[dict[str, str], dict[str, dict[str, int]], str]:
    """Pseudo-queries of the index's documents (training.pseudo) as a split to tune on, and its recorded name."""
    index = open_index(index_dir, verify="size", query_precision=query_precision)
    try:
        pseudo = generate(index, recipe, max_queries, filter_depth, progress=progress)
    finally:
        index.close()
    return pseudo.queries, pseudo.qrels, source_name(recipe, max_queries, filter_depth)


def tune_fusion_on_index(  # noqa: PLR0913
    index_dir: Path,
    queries: dict[str, str],
    qrels: dict,
    qrels_path: Path | str,
    metric: str = "ndcg@10",
    out: Path | None = None,
    write: bool = True,
    progress: bool = True,
    query_precision: str = "auto",
    level: float | None = SIGNIFICANCE_LEVEL,
) -> tuple[TuningResult, dict]:
    """Tune the fusion of an index on a labelled split (tune_fusion) and save table + plot; the winner becomes the
    index's default only when tuning beats the untuned default out of sample. A chunked index's passage scoring, then
    the BM25 leg's field weights where the index keeps them, are chosen first, the same way (training.passages,
    training.fields). Returns the result and the fusion's evidence (recorded in the manifest with the others' when
    `write`); `level` as in `evidence`."""
    refuse_test_split(qrels_path)
    index = open_index(index_dir, verify="size", query_precision=query_precision)  # queries embedded as served
    scoring: PassageSpec | None = None
    scoring_proof: dict = {}
    if index.passages is not None:  # a chunked index: first how a document scores from its passages, which fusion sees
        scoring, scoring_proof = tune_passage_scoring(
            index.pipeline(), index.doc_ids, queries, qrels, str(qrels_path), metric, progress=progress
        )
    overrides: dict = {"passage_scoring": asdict(scoring)} if scoring is not None else {}
    fields: tuple[dict[str, float] | None, dict] | None = None
    fielded = index.fielded_bm25
    if fielded is not None and fielded.has_fields and (scoring is None or scoring.bm25 == "document"):
        fields = tune_text_fields(
            index.pipeline(overrides), index.doc_ids, queries, qrels, str(qrels_path), metric, progress=progress, level=level
        )
        overrides["text_fields"] = fields[0]
    pipeline = index.pipeline(overrides or None)
    served = index.manifest.defaults.fusion
    result = tune_fusion(pipeline, index.doc_ids, queries, qrels, metric=metric, progress=progress)
    index.close()
    out = out or Path(index_dir) / "tuning"
    out.mkdir(parents=True, exist_ok=True)
    plot(result, out / "fusion.png")
    (out / "fusion.json").write_text(
        json.dumps({"metric": metric, "queries": result.queries, "singles": result.singles, "table": result.table}, indent=2)
    )
    proof = evidence(result, qrels_path, level=level, served=served)
    if write:
        scored = (scoring, scoring_proof) if scoring is not None else None
        update_manifest(index_dir, _recorder(result, proof, scored, fields, str(qrels_path), pipeline.defaults.depth))
    return result, proof


def _recorder(
    result: TuningResult,
    proof: dict,
    scoring: tuple[PassageSpec, dict] | None,
    fields: tuple[dict[str, float] | None, dict] | None,
    qrels: str,
    depth: int,
) -> Callable[[Manifest], None]:
    """What tuning writes into the manifest: the default fusion (the tuned one only when `proof` says so), the passage
    scoring and the field weights when they were chosen, their evidence, and the tuning's summary."""
    tuned = proof["decision"] == "tuned"

    def record(manifest: Manifest) -> None:
        manifest.defaults = replace(manifest.defaults, fusion=result.best_fusion() if tuned else SearchSpec().fusion)
        manifest.evidence["fusion"] = proof
        if scoring is not None:
            manifest.defaults = replace(manifest.defaults, passage_scoring=scoring[0])
            manifest.evidence["passage_scoring"] = scoring[1]
        if fields is not None:
            manifest.defaults = replace(manifest.defaults, text_fields=fields[0])
            manifest.evidence["text_fields"] = fields[1]
        manifest.fusion_tuning = FusionTuning(
            metric=result.metric,
            value=round(result.cross_validated() if tuned else result.value_of(SearchSpec().fusion), 4),
            queries=result.queries,
            qrels=qrels,
            depth=depth,
            best_per_norm={n: result.best("cc", n)["alpha"] for n in NORMALIZERS},
            best_rrf_k=result.best("rrf")["rrf_k"],
            tuned_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            decision=proof["decision"],
            best_in_sample=round(result.best()[result.metric], 4),
        )

    return record
