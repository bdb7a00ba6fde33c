"""Choose how a chunked index scores a document from its passages, on labelled training queries.

The untuned default is `max` (a document is its best passage); the candidates add `soft` (a soft maximum of its best
three) at a few temperatures. Each is scored by the dense leg alone, the leg it changes. The best becomes the index's
default only if choosing it beats `max` on held-out queries (5-fold cross-validation, as training.fusion does).
"""

from __future__ import annotations

from dataclasses import asdict

from tqdm import tqdm

from hybrid_retrieval.search.pipeline import SearchPipeline
from hybrid_retrieval.search.spec import PassageSpec
from hybrid_retrieval.training.metrics import chosen_out_of_sample, per_query_scores

FOLDS = 5
CANDIDATES = (PassageSpec(), *(PassageSpec("soft", temperature, 3) for temperature in (0.02, 0.05, 0.1)))


def label(scoring: PassageSpec) -> str:
    return "max" if scoring.aggregation == "max" else f"soft t={scoring.temperature:g} top={scoring.top}"


def tune_passage_scoring(
    pipeline: SearchPipeline,
    doc_ids: list[str],
    queries: dict[str, str],
    qrels: dict[str, dict[str, int]],
    split: str,
    metric: str = "ndcg@10",
    k: int = 100,
    progress: bool = True,
) -> tuple[PassageSpec, dict]:
    """(the scoring to make the default, the evidence): every candidate's dense run on `queries`, and the decision."""
    vectors = dict(zip(queries, pipeline.embedder.encode(list(queries.values()))))  # one model run for every candidate
    per_query = []
    for scoring in tqdm(CANDIDATES, desc="passage scoring", disable=not progress):
        spec = pipeline.resolve(
            {"mode": "dense", "hubness": {"method": "none"}, "rerank": {"enabled": False}, "passage_scoring": asdict(scoring)}
        )
        run = {}
        for qid, text in queries.items():
            ranking = pipeline.search(text, k=k, spec=spec, vector=vectors[qid]).ranking
            run[qid] = {doc_ids[i]: float(s) for i, s in zip(ranking.doc_idx, ranking.scores)}
        per_query.append(per_query_scores(run, qrels, (metric,))[metric])
    means = [sum(row.values()) / len(qrels) for row in per_query]
    best = max(range(len(CANDIDATES)), key=lambda i: means[i])  # the first of equals: max
    before, after = means[0], chosen_out_of_sample(per_query, FOLDS)
    decision = "tuned" if after > before and best != 0 else "kept untuned"
    evidence = {
        "metric": metric,
        "queries": len(queries),
        "split": split,
        "folds": FOLDS,
        "values": {
            "untuned max": round(before, 4),
            "tuned, cross-validated": round(after, 4),
            f"tuned {label(CANDIDATES[best])}, in-sample": round(means[best], 4),
        },
        "candidates": {label(scoring): round(mean, 4) for scoring, mean in zip(CANDIDATES, means)},
        "decision": decision,
    }
    return (CANDIDATES[best] if decision == "tuned" else PassageSpec()), evidence
