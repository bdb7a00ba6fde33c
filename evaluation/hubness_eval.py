"""Choose hubness betas on labelled bank queries (cross-fitted), and report hubness diagnostics.

Tuning never scores a query with a bank that contains it: the bank's queries are split into folds and
each fold is evaluated with biases fitted on the other folds (5-fold cross-fitting).
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np

from evaluation.metrics import evaluate
from search.hubness import (
    BIAS_COLUMNS,
    HubnessCorrection,
    HubnessParams,
    bank_statistics,
    hubness_stats,
    k_occurrence,
)
from search.ranking import Ranking, top_k

BETAS = (1.0, 5.0, 10.0, 20.0, 30.0, 50.0)
DB_BETA1 = (1 / 1.99, 5.0, 20.0)
DB_BETA2 = (1.0, 3.0, 10.0, 20.0)
VARIANTS = (("none", False), ("qbnorm", False), ("qbnorm", True), ("dbnorm", False), ("dbnorm", True))


def corrected_rankings(queries: np.ndarray, embeddings: np.ndarray, correction: HubnessCorrection | None,
                       method: str, dynamic: bool, k: int) -> list[Ranking]:
    """Exact corrected top-k by brute force (tuning and diagnostics: many queries, no index needed)."""
    sims = queries @ embeddings.T
    out = []
    for row in sims:
        if correction is None or method == "none":
            out.append(top_k(row, k))
            continue
        coef = correction.coefficients(method, dynamic, int(np.argmax(row)))
        out.append(top_k(correction.corrected(row, np.arange(len(row)), coef), k))
    return out


def tune_hubness(bank: np.ndarray, bank_qids: list[str], qrels: dict, embeddings: np.ndarray, doc_ids: list[str],
                 method: str, dynamic: bool, base: HubnessParams, gallery: np.ndarray, folds: int = 5,
                 metric: str = "ndcg@10", seed: int = 0) -> tuple[HubnessParams, list[dict]]:
    """Grid-search beta (qbnorm) or (beta1, beta2) (dbnorm) by cross-fitting over the bank queries."""
    fold_of = np.random.default_rng(seed).permutation(len(bank)) % folds
    grid = [{"beta": b} for b in BETAS] if method == "qbnorm" else [{"beta1": b1, "beta2": b2} for b1, b2 in itertools.product(DB_BETA1, DB_BETA2)]
    gallery_lse = {}  # the gallery holds documents, not queries: shared by every fold
    table = []
    for point in grid:
        params = replace(base, **point)
        if method == "dbnorm" and params.beta2 not in gallery_lse:
            gallery_lse[params.beta2] = bank_statistics(embeddings[gallery], embeddings, params.beta2, params.k, self_idx=gallery)
        run = {}
        for f in range(folds):
            train, held = bank[fold_of != f], np.flatnonzero(fold_of == f)
            beta = params.beta if method == "qbnorm" else params.beta1
            lse_b, act_b = bank_statistics(train, embeddings, beta, params.k)
            lse = {BIAS_COLUMNS[0]: lse_b, BIAS_COLUMNS[1]: lse_b, BIAS_COLUMNS[2]: np.zeros(len(embeddings))}
            activation = {"query": act_b, "gallery": np.zeros(len(embeddings), dtype=bool)}
            if method == "dbnorm":
                lse[BIAS_COLUMNS[2]], activation["gallery"] = gallery_lse[params.beta2]
            correction = HubnessCorrection(params, lse, activation)
            for i, ranking in zip(held, corrected_rankings(bank[held], embeddings, correction, method, dynamic, 100)):
                run[bank_qids[i]] = {doc_ids[d]: float(s) for d, s in zip(ranking.doc_idx, ranking.scores)}
        table.append({**point, metric: evaluate(run, qrels, (metric,))[metric]})
    best = max(table, key=lambda row: row[metric])
    return replace(base, **{k: v for k, v in best.items() if k != metric}), table


def hubness_report(queries: np.ndarray, embeddings: np.ndarray, correction: HubnessCorrection, doc_ids: list[str], k: int = 10) -> dict:
    """N_k skewness, never-retrieved share and top hubs of the dense top-k, for every variant."""
    report = {}
    for method, dynamic in VARIANTS:
        counts = k_occurrence(corrected_rankings(queries, embeddings, correction, method, dynamic, k), len(embeddings), k)
        hubs = np.argsort(-counts, kind="stable")[:5]
        name = method if method == "none" else f"{method} {'DIS' if dynamic else 'IS'}"
        report[name] = {**hubness_stats(counts), "top_hubs": [(doc_ids[h], int(counts[h])) for h in hubs], "counts": counts}
    return report


def plot_histograms(report: dict, path, k: int = 10) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    top = max(int(v["counts"].max()) for v in report.values())
    bins = np.arange(0, top + 2)
    for name, values in report.items():
        ax.hist(values["counts"], bins=bins, histtype="step", label=f"{name} (skew {values['skewness']:.2f})", log=True)
    ax.set_xlabel(f"N_{k}: number of queries whose top-{k} holds the document")
    ax.set_ylabel("documents (log scale)")
    ax.set_title("k-occurrence distribution, dense retrieval")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
