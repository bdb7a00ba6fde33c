"""Fit a hubness correction into an index from a query bank, optionally choosing its betas on the
bank's labels by cross-fitting: no query is ever scored with a bank that contains it (the bank's
queries are split into folds and each fold is evaluated with biases fitted on the other folds).
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from pathlib import Path

import numpy as np

from indexer.corpus import read_qrels
from indexer.hubness import DEFAULT_GALLERY_SIZE, DEFAULT_PSEUDO_SIZE, fit_hubness, load_bank, pseudo_bank, sample_gallery
from indexer.manifest import Manifest
from indexer.store import open_index
from search.errors import ConfigError
from search.hubness import BIAS_COLUMNS, HubnessCorrection, HubnessParams, bank_statistics
from search.ranking import Ranking, top_k
from search.spec import HubnessSpec
from training.metrics import evaluate

BETAS = (1.0, 5.0, 10.0, 20.0, 30.0, 50.0)
DB_BETA1 = (1 / 1.99, 5.0, 20.0)
DB_BETA2 = (1.0, 3.0, 10.0, 20.0)
FOLDS = 5


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
                 method: str, dynamic: bool, base: HubnessParams, gallery: np.ndarray, folds: int = FOLDS,
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


def fit_from_bank(index_dir: Path | str, bank: str | Path, default: HubnessSpec, params: HubnessParams = HubnessParams(),
                  split_qrels: Path | None = None, tune: bool = False, gallery_size: int = DEFAULT_GALLERY_SIZE,
                  pseudo_size: int = DEFAULT_PSEUDO_SIZE) -> Manifest:
    """`hybrid hubness fit`: read the bank (queries of a split, a query log, or `pseudo` document titles),
    optionally tune `default.method`'s betas on the bank's labels, fit and write both corrections."""
    index = open_index(index_dir, verify="size", device="cpu")
    try:
        texts, info = pseudo_bank(index, pseudo_size) if str(bank) == "pseudo" else load_bank(bank, split_qrels)
        vectors, tuning = index.embedder.encode(texts), None
        if tune:
            if info["kind"] != "queries":
                raise ConfigError("--tune needs a labelled bank: --bank queries.jsonl --split-qrels qrels/train.tsv")
            qrels = read_qrels(split_qrels)
            embeddings = np.asarray(index.embeddings)
            params, table = tune_hubness(vectors, list(qrels), qrels, embeddings, index.doc_ids, default.method,
                                         default.dynamic, params, sample_gallery(len(embeddings), gallery_size))
            tuning = {"metric": "ndcg@10", "folds": FOLDS, "table": table}
        return fit_hubness(index, texts, info, params, default, gallery_size, tuning=tuning, bank=vectors)
    finally:
        index.close()
