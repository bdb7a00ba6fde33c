"""IR metrics through pytrec_eval (the trec_eval implementation BEIR uses)."""

from __future__ import annotations

import numpy as np
import pytrec_eval

# Our names -> trec_eval measures. Cut-offs follow BEIR's conventions.
MEASURES = {
    "ndcg@10": "ndcg_cut_10",
    "recall@100": "recall_100",
    "mrr@10": "recip_rank",  # computed on runs truncated to 10 (see evaluate)
    "map@100": "map_cut_100",
}


def evaluate(run: dict[str, dict[str, float]], qrels: dict[str, dict[str, int]], metrics=tuple(MEASURES)) -> dict[str, float]:
    """Mean of each metric over the judged queries; a judged query missing from the run scores 0."""
    unknown = set(metrics) - set(MEASURES)
    if unknown:
        raise ValueError(f"unknown metrics {sorted(unknown)}; valid: {', '.join(MEASURES)}")
    per_query = per_query_scores(run, qrels, metrics)
    return {m: sum(scores.values()) / len(qrels) for m, scores in per_query.items()}


def chosen_out_of_sample(per_query: list[dict[str, float]], folds: int = 5, seed: int = 0) -> float:
    """The metric of choosing among candidates, out of sample (the mean of `out_of_sample_scores`). Compare it with a
    fixed default, not the in-sample maximum."""
    return float(out_of_sample_scores(per_query, folds, seed).mean())


def out_of_sample_scores(per_query: list[dict[str, float]], folds: int = 5, seed: int = 0) -> np.ndarray:
    """Each query's metric when choosing among candidates out of sample, in sorted query id order: `per_query[c][qid]`
    is candidate c's metric on query qid; for each fold, the candidate best on the other folds (the first of equals)
    scores the fold's queries."""
    qids = sorted(per_query[0])
    values = np.array([[row[q] for q in qids] for row in per_query])  # candidates x queries
    fold = np.random.default_rng(seed).permutation(len(qids)) % folds
    scores = np.empty(len(qids))
    for f in range(folds):
        chosen = int(np.argmax(values[:, fold != f].mean(axis=1)))
        scores[fold == f] = values[chosen, fold == f]
    return scores


def format_evidence(evidence: dict) -> str:
    """A default's before/after table on held-out queries (the `evidence` of training.fusion, training.hubness,
    models.cross_encoder.weight_evidence), for the terminal."""
    how = f", {evidence['folds']}-fold cross-validation" if "folds" in evidence else ""
    lines = [f"before/after on held-out queries ({evidence['queries']} queries, {evidence['split']}{how}):"]
    lines += [f"  {name:<40}{evidence['metric']} {value:.4f}" for name, value in evidence["values"].items()]
    test = f" (paired randomisation test p = {evidence['p']:.4f})" if "p" in evidence else ""
    return "\n".join(lines + [f"decision: {evidence['decision']}{test}"])


def per_query_scores(run, qrels, metrics=tuple(MEASURES)) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {m: {qid: 0.0 for qid in qrels} for m in metrics}
    plain = [m for m in metrics if m != "mrr@10"]
    if plain:
        evaluator = pytrec_eval.RelevanceEvaluator(qrels, {MEASURES[m] for m in plain})
        for qid, values in evaluator.evaluate(run).items():
            for m in plain:
                out[m][qid] = values[MEASURES[m]]
    if "mrr@10" in metrics:
        top10 = {qid: dict(sorted(docs.items(), key=lambda kv: -kv[1])[:10]) for qid, docs in run.items()}
        for qid, values in pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank"}).evaluate(top10).items():
            out["mrr@10"][qid] = values["recip_rank"]
    return out
