"""Choose how a chunked index scores a document from its passages, on labelled training queries.

Two choices, each scored by the leg it changes: the dense aggregation (`max`, the untuned default: a document is its
best passage; or `soft`, a soft maximum of its best three, at a few temperatures) and the BM25 unit (the whole
`document`, the untuned default, or its best passage). A candidate becomes the index's default only if choosing beats
the untuned default on held-out queries (5-fold cross-validation, as training.fusion does).
"""

from __future__ import annotations

from dataclasses import asdict, replace

import numpy as np
from tqdm import tqdm

from hybrid_retrieval.quality.metrics import chosen_out_of_sample, per_query_scores
from hybrid_retrieval.search.pipeline import SearchPipeline
from hybrid_retrieval.search.spec import BM25_UNITS, PassageSpec

FOLDS = 5
AGGREGATIONS = (PassageSpec(), *(PassageSpec("soft", temperature, 3) for temperature in (0.02, 0.05, 0.1)))


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
    """(the scoring to make the default, the evidence of each choice)."""
    vectors = dict(zip(queries, pipeline.embedder.encode(list(queries.values()))))  # one model run for every candidate

    def choose(mode: str, candidates: dict[str, PassageSpec]) -> tuple[PassageSpec, dict]:
        per_query = []
        for scoring in tqdm(candidates.values(), desc=f"passage scoring, {mode}", disable=not progress):
            spec = pipeline.resolve(
                {"mode": mode, "hubness": {"method": "none"}, "rerank": {"enabled": False}, "passage_scoring": asdict(scoring)}
            )
            run = {}
            for qid, text in queries.items():
                ranking = pipeline.search(text, k=k, spec=spec, vector=vectors[qid] if mode == "dense" else None).ranking
                run[qid] = {doc_ids[i]: float(s) for i, s in zip(ranking.doc_idx, ranking.scores)}
            per_query.append(per_query_scores(run, qrels, (metric,))[metric])
        means = [sum(row.values()) / len(qrels) for row in per_query]
        names = list(candidates)
        best = int(np.argmax(means))  # the first of equals: the untuned default
        before, after = means[0], chosen_out_of_sample(per_query, FOLDS)
        decision = "tuned" if after > before and best != 0 else "kept untuned"
        evidence = {
            "metric": metric,
            "queries": len(queries),
            "split": split,
            "folds": FOLDS,
            "leg": mode,
            "values": {
                f"untuned {names[0]}": round(before, 4),
                "tuned, cross-validated": round(after, 4),
                f"tuned {names[best]}, in-sample": round(means[best], 4),
            },
            "candidates": {name: round(mean, 4) for name, mean in zip(names, means)},
            "decision": decision,
        }
        return candidates[names[best] if decision == "tuned" else names[0]], evidence

    chosen, dense = choose("dense", {label(scoring): scoring for scoring in AGGREGATIONS})
    evidence = {"dense": dense}
    if pipeline.passages is not None and pipeline.passages.lexical is not None:
        units = {unit: replace(chosen, bm25=unit) for unit in BM25_UNITS}  # the untuned unit first
        chosen, evidence["bm25"] = choose("bm25", units)
    return chosen, evidence
