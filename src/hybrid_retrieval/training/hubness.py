"""Fit a hubness correction into an index from a query bank, optionally choosing its betas on the
bank's labels by cross-fitting: no query is ever scored with a bank that contains it (the bank's
queries are split into folds and each fold is evaluated with biases fitted on the other folds).
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from pathlib import Path

import numpy as np

from hybrid_retrieval.common.errors import ConfigError, HybridError
from hybrid_retrieval.indexer.corpus import read_qrels
from hybrid_retrieval.indexer.hubness import DEFAULT_GALLERY_SIZE, DEFAULT_PSEUDO_SIZE, fit_hubness, load_bank, pseudo_bank, sample_gallery
from hybrid_retrieval.indexer.manifest import Manifest
from hybrid_retrieval.indexer.store import open_index
from hybrid_retrieval.quality.metrics import chosen_out_of_sample, per_query_scores
from hybrid_retrieval.search.hubness import BIAS_COLUMNS, HubnessCorrection, HubnessParams, bank_statistics
from hybrid_retrieval.search.ranking import Ranking, top_k
from hybrid_retrieval.search.spec import HubnessSpec

BETAS = (1.0, 5.0, 10.0, 20.0, 30.0, 50.0)
DB_BETA1 = (1 / 1.99, 5.0, 20.0)
DB_BETA2 = (1.0, 3.0, 10.0, 20.0)
FOLDS = 5
# Inverse temperatures per unit of score spread (see `score_spread`): what cross-fitting chose on a labelled dataset,
# scaled by its spread, so that an unlabelled one starts from the same sharpness (docs/relevance.md, "Hubness").
BETA_PER_SPREAD = {"beta": 0.25, "beta1": 0.25, "beta2": 0.05}
SPREAD_TOP = 100


def corrected_rankings(
    queries: np.ndarray, embeddings: np.ndarray, correction: HubnessCorrection | None, method: str, dynamic: bool, k: int
) -> list[Ranking]:
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


class CrossFit:
    """The metric of dense retrieval over labelled bank queries with a correction fitted on the other folds
    (5-fold cross-fitting): no query is scored with a bank that contains it."""

    def __init__(  # noqa: PLR0913
        self,
        bank: np.ndarray,
        bank_qids: list[str],
        qrels: dict,
        embeddings: np.ndarray,
        doc_ids: list[str],
        gallery: np.ndarray,
        folds: int = FOLDS,
        metric: str = "ndcg@10",
        seed: int = 0,
    ):
        self.bank, self.bank_qids, self.qrels, self.embeddings, self.doc_ids = bank, bank_qids, qrels, embeddings, doc_ids
        self.gallery, self.folds, self.metric = gallery, folds, metric
        self.fold_of = np.random.default_rng(seed).permutation(len(bank)) % folds
        self._gallery_lse = {}  # the gallery holds documents, not queries: shared by every fold

    def score(self, params: HubnessParams, method: str, dynamic: bool) -> float:
        """Cross-fitted metric of `method` at `params` (method "none": the raw cosine, nothing fitted)."""
        values = self.per_query(params, method, dynamic)
        return sum(values.values()) / len(values)

    def per_query(self, params: HubnessParams, method: str, dynamic: bool) -> dict[str, float]:
        run = {}
        for f in range(self.folds):
            held = np.flatnonzero(self.fold_of == f)
            correction = None if method == "none" else self._fit(params, method, self.bank[self.fold_of != f])
            for i, ranking in zip(held, corrected_rankings(self.bank[held], self.embeddings, correction, method, dynamic, 100)):
                run[self.bank_qids[i]] = {self.doc_ids[d]: float(s) for d, s in zip(ranking.doc_idx, ranking.scores)}
        return per_query_scores(run, self.qrels, (self.metric,))[self.metric]

    def _fit(self, params: HubnessParams, method: str, train: np.ndarray) -> HubnessCorrection:
        n = len(self.embeddings)
        beta = params.beta if method == "qbnorm" else params.beta1
        fit = bank_statistics(train, self.embeddings, beta, params.k)
        lse_b, act_b = fit.lse, fit.activation
        lse = {BIAS_COLUMNS[0]: lse_b, BIAS_COLUMNS[1]: lse_b, BIAS_COLUMNS[2]: np.zeros(n)}
        activation = {"query": act_b, "gallery": np.zeros(n, dtype=bool)}
        if method == "dbnorm":
            if params.beta2 not in self._gallery_lse:
                fit = bank_statistics(self.embeddings[self.gallery], self.embeddings, params.beta2, params.k, self_idx=self.gallery)
                self._gallery_lse[params.beta2] = fit.lse, fit.activation
            lse[BIAS_COLUMNS[2]], activation["gallery"] = self._gallery_lse[params.beta2]
        return HubnessCorrection(params, lse, activation)


def tune_hubness(cross_fit: CrossFit, method: str, dynamic: bool, base: HubnessParams) -> tuple[HubnessParams, list[dict], float]:
    """Grid-search beta (qbnorm) or (beta1, beta2) (dbnorm) by cross-fitting over the bank queries. Returns
    the best params, the table, and the metric of the choice itself out of sample (choosing on other
    queries than those scored), which is what a comparison with no correction may use."""
    grid = (
        [{"beta": b} for b in BETAS]
        if method == "qbnorm"
        else [{"beta1": b1, "beta2": b2} for b1, b2 in itertools.product(DB_BETA1, DB_BETA2)]
    )
    per_query = [cross_fit.per_query(replace(base, **point), method, dynamic) for point in grid]
    table = [{**point, cross_fit.metric: sum(values.values()) / len(values)} for point, values in zip(grid, per_query)]
    best = max(table, key=lambda row: row[cross_fit.metric])
    return (
        replace(base, **{k: v for k, v in best.items() if k != cross_fit.metric}),
        table,
        chosen_out_of_sample(per_query, cross_fit.folds),
    )


class DefaultRefused(HybridError):
    """A correction did not beat no correction on held-out bank queries, so it is not made the default."""


def score_spread(bank: np.ndarray, embeddings: np.ndarray, top: int = SPREAD_TOP, chunk: int = 1024) -> float:
    """The median, over bank queries, of the standard deviation of their top-`top` cosines: the score
    scale an inverse temperature has to match (it differs between embedding models, not between banks:
    0.051 for scifact's train queries and 0.052 for its document titles with all-MiniLM-L6-v2)."""
    stds = []
    for start in range(0, len(bank), chunk):
        sims = bank[start : start + chunk] @ embeddings.T
        take = min(top, sims.shape[1])
        stds.append(np.partition(sims, sims.shape[1] - take, axis=1)[:, -take:].std(axis=1))
    return float(np.median(np.concatenate(stds)))


def scaled_params(spread: float, k: int = 1, **given) -> HubnessParams:
    """Betas for a model whose top scores spread by `spread`: BETA_PER_SPREAD / spread, unless given."""
    if spread <= 0 and set(BETA_PER_SPREAD) - set(given):
        raise ConfigError("the bank's scores do not spread at all: pass --beta, --beta1 and --beta2")
    return HubnessParams(**{name: given[name] if name in given else scale / spread for name, scale in BETA_PER_SPREAD.items()}, k=k)


def fit_hubness_from_bank(  # noqa: PLR0913
    index_dir: Path | str,
    bank: str | Path,
    candidate: HubnessSpec,
    betas: dict | None = None,
    k: int = 1,
    split_qrels: Path | None = None,
    tune: bool | None = None,
    set_default: bool = False,
    force: bool = False,
    gallery_size: int = DEFAULT_GALLERY_SIZE,
    pseudo_size: int = DEFAULT_PSEUDO_SIZE,
) -> Manifest:
    """`hybrid hubness fit`: read the bank (queries of a split, a query log, or `pseudo` document titles),
    fit and write both corrections (fit_hubness).

    Betas: those `betas` names, the others scaled to the model's score spread (`scaled_params`); with
    a labelled bank `candidate.method`'s are then tuned by cross-fitting (tune_hubness, unless `tune` is False).
    Fitting makes the corrections available to requests; `candidate` becomes the index's default only
    with `set_default`, and then, when the bank is labelled, only if its cross-fitted metric beats no
    correction (a tie keeps the simpler default; `force` overrides, and is recorded). Otherwise
    DefaultRefused, with the numbers, and nothing is written."""
    if gallery_size < 1 or pseudo_size < 1:
        raise ConfigError(f"--gallery-size and --pseudo-size must be >= 1, got {gallery_size} and {pseudo_size}")
    index = open_index(index_dir, verify="size", device="cpu")
    try:
        texts, info = pseudo_bank(index, pseudo_size) if str(bank) == "pseudo" else load_bank(bank, split_qrels)
        labelled = info["kind"] == "queries"
        tune = labelled if tune is None else tune
        if tune and not labelled:
            raise ConfigError("--tune needs a labelled bank: --bank queries.jsonl --split-qrels qrels/train.tsv")
        vectors, embeddings = index.query_embedder.encode(texts), np.asarray(index.embeddings)
        params, source = _starting_betas(vectors, embeddings, k, betas or {})
        tuning, evidence, tuned_score = None, None, None
        if labelled and (tune or set_default):
            qrels = read_qrels(split_qrels)
            cross_fit = CrossFit(vectors, list(qrels), qrels, embeddings, index.doc_ids, sample_gallery(len(embeddings), gallery_size))
            if tune:
                params, tuning, tuned_score = _tuned(cross_fit, candidate, params, source)
            if set_default:
                evidence = _default_evidence(cross_fit, candidate, params, info, force, tuned_score)
        elif set_default:
            evidence = _forced_evidence(candidate, info, force)
        default = candidate if set_default else None
        return fit_hubness(
            index, texts, info, params, default, gallery_size, tuning=tuning, bank=vectors, evidence=evidence, beta_source=source
        )
    finally:
        index.close()


def _starting_betas(vectors: np.ndarray, embeddings: np.ndarray, k: int, betas: dict) -> tuple[HubnessParams, dict]:
    """The betas `betas` names, the others scaled to the bank's score spread, and a record of how they were set."""
    spread = score_spread(vectors, embeddings)
    scaled = [name for name in BETA_PER_SPREAD if name not in betas]
    how = [f"{', '.join(sorted(betas))} given" if betas else "", f"{', '.join(scaled)} scaled to the score spread" if scaled else ""]
    return scaled_params(spread, k, **betas), {"spread": round(spread, 4), "betas": "; ".join(filter(None, how))}


def _tuned(cross_fit: CrossFit, candidate: HubnessSpec, params: HubnessParams, source: dict) -> tuple[HubnessParams, dict, float]:
    """`candidate.method`'s betas tuned by cross-fitting, the tuning's table, and the out-of-sample metric of the choice;
    `source` says so."""
    params, table, tuned_score = tune_hubness(cross_fit, candidate.method, candidate.dynamic, params)
    source["betas"] = f"{candidate.method}'s tuned by {cross_fit.folds}-fold cross-fitting; {source['betas']}"
    return params, {"metric": cross_fit.metric, "folds": cross_fit.folds, "table": table}, tuned_score


def _forced_evidence(candidate: HubnessSpec, info: dict, force: bool) -> dict:
    """An unlabelled bank cannot show that a correction helps: its default is refused unless forced."""
    if not force:
        raise DefaultRefused(
            f"a {info['kind']} bank has no labels to show that {candidate_name(candidate)} helps: nothing "
            "written; use a labelled bank (--bank queries.jsonl --split-qrels qrels/train.tsv), or --force"
        )
    return {"decision": "forced", "why": f"unlabelled bank ({info['kind']}): nothing to compare on"}


def _default_evidence(
    cross_fit: CrossFit, candidate: HubnessSpec, params: HubnessParams, info: dict, force: bool, tuned_score: float | None = None
) -> dict:
    """`tuned_score`: when the betas were tuned on these queries, the out-of-sample metric of that choice,
    so the comparison does not favour the correction by its own selection."""
    corrected = cross_fit.score(params, candidate.method, candidate.dynamic) if tuned_score is None else tuned_score
    name = candidate_name(candidate) + (" (betas tuned, chosen out of sample)" if tuned_score is not None else "")
    values = {"none": cross_fit.score(params, "none", False), name: corrected}
    evidence = {
        "metric": cross_fit.metric,
        "retrieval": "dense",
        "queries": len(cross_fit.bank),
        "split": info.get("split"),
        "folds": cross_fit.folds,
        "values": values,
    }
    if corrected > values["none"]:  # a tie keeps the simpler default
        return {**evidence, "decision": "enabled"}
    if not force:
        raise DefaultRefused(
            f"{name} does not beat no correction on the bank's held-out folds "
            f"({cross_fit.metric} {corrected:.4f} vs {values['none']:.4f} over {len(cross_fit.bank)} queries, "
            f"{cross_fit.folds}-fold cross-fitting): nothing written; fit it without --set-default to make it "
            "available to requests, or --force to make it the default anyway"
        )
    return {**evidence, "decision": "forced"}


def candidate_name(spec: HubnessSpec) -> str:
    return spec.method + (" DIS" if spec.dynamic else " IS") if spec.method != "none" else "none"
