"""Choose the BM25 leg's field weights (search.fields) on labelled training queries.

The candidates: title and text as one field (the untuned default), and BM25F with the title weighted 1 to 6 against
the text's 1, each scored by the BM25 leg alone. A weighting becomes the index's default only if choosing among them
beats one field on held-out queries (5-fold cross-validation) by a paired randomization test at the project's level,
as training.fusion decides for the fusion.
"""

from __future__ import annotations

import numpy as np
from tqdm import tqdm

from hybrid_retrieval.quality.metrics import out_of_sample_scores, per_query_scores
from hybrid_retrieval.quality.significance import SIGNIFICANCE_LEVEL, randomization_test
from hybrid_retrieval.search.pipeline import SearchPipeline

FOLDS = 5
TITLE_WEIGHTS = (1.0, 2.0, 3.0, 4.0, 6.0)
RUN_DEPTH = 100  # hits a query's run keeps


def label(text_fields: dict[str, float] | None) -> str:
    return "one field" if text_fields is None else f"title {text_fields['title']:g}, text {text_fields['text']:g}"


def tune_text_fields(
    pipeline: SearchPipeline,
    doc_ids: list[str],
    queries: dict[str, str],
    qrels: dict[str, dict[str, int]],
    split: str,
    metric: str = "ndcg@10",
    progress: bool = True,
    level: float | None = SIGNIFICANCE_LEVEL,
) -> tuple[dict[str, float] | None, dict]:
    """(the field weights to make the default, None for one field; the evidence). `level` None: adopted when it wins
    out of sample at all (a caller that tests on queries of its own)."""
    candidates: list[dict[str, float] | None] = [None, *({"title": w, "text": 1.0} for w in TITLE_WEIGHTS)]
    per_query = []
    for text_fields in tqdm(candidates, desc="field weights", disable=not progress):
        spec = pipeline.resolve({"mode": "bm25", "text_fields": text_fields})
        run = {}
        for qid, text in queries.items():
            ranking = pipeline.search(text, k=RUN_DEPTH, spec=spec).ranking
            run[qid] = {doc_ids[i]: float(s) for i, s in zip(ranking.doc_idx, ranking.scores)}
        per_query.append(per_query_scores(run, qrels, (metric,))[metric])
    means = [sum(row.values()) / len(qrels) for row in per_query]
    best = int(np.argmax(means))  # the first of equals: one field
    chosen = out_of_sample_scores(per_query, FOLDS)
    untuned = np.array([per_query[0][q] for q in sorted(per_query[0])])
    gains = chosen - untuned
    p = randomization_test(gains, np.zeros_like(gains))
    won = best != 0 and gains.mean() > 1e-12 and (level is None or p < level)
    evidence = {
        "metric": metric,
        "queries": len(queries),
        "split": split,
        "folds": FOLDS,
        "leg": "bm25",
        "values": {
            "untuned one field": round(means[0], 4),
            "tuned, cross-validated": round(float(chosen.mean()), 4),
            f"tuned {label(candidates[best])}, in-sample": round(means[best], 4),
        },
        "candidates": {label(c): round(mean, 4) for c, mean in zip(candidates, means)},
        "p": round(p, 4),
        "decision": "tuned" if won else "kept untuned",
    }
    return (candidates[best] if won else None), evidence
