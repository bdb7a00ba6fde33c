"""Hubness correction of dense scores: QB-Norm and DBNorm, exact over the whole corpus.

QB-Norm (Bogolin et al., CVPR 2022), Inverted Softmax with a query bank B and inverse temperature beta:
    eta(q, d) = exp(beta s(q,d)) / sum_{b in B} exp(beta s(b,d))
DBNorm (Wang et al., EMNLP 2023), dual Inverted Softmax with a query bank B and a gallery bank G:
    eta(q, d) = [exp(b1 s(q,d)) / sum_B exp(b1 s(b,d))] * [exp(b2 s(q,d)) / sum_G exp(b2 s(g,d))]

In log space both rank by the raw cosine minus a fixed per-document bias,
    log(eta) / (sum of active betas) = s(q,d) - sum_active LSE_bank(d) / sum_active betas,
    LSE_bank(d) = logsumexp_{b in bank} beta_bank * s(b,d),
so the biases are computed once (see `bank_statistics`) and the exact corrected top-k over the whole
corpus is an inner-product search over augmented vectors d' = [d, -LSE_B(d), -LSE_G(d), ...] with
q' = [q, coefficients]. We report corrected scores on that scale (cosine units minus the bias).

Dynamic variants (DIS): a bank's factor is applied only when the query's raw top-1 document is in the
bank's activation set (the union of every bank member's raw top-k documents); with no active factor
the raw cosine is kept.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from hybrid_retrieval.common.errors import ConfigError
from hybrid_retrieval.search import checks
from hybrid_retrieval.search.dense import exact_top_k
from hybrid_retrieval.search.filters.language import Allowed
from hybrid_retrieval.search.ranking import Ranking

HUBNESS_METHODS = ("none", "qbnorm", "dbnorm")
# Columns of the augmented vectors, after the embedding: one bias column per fitted bank statistic.
BIAS_COLUMNS = ("qbnorm_query", "dbnorm_query", "dbnorm_gallery")


@dataclass(frozen=True)
class BankFit:
    """One bank over a corpus: each document's LSE, and each member's raw top-k (what its activation set is made of)."""

    lse: np.ndarray  # float64 (n,)
    top_sims: np.ndarray  # float32 (m, k): -inf where a member has fewer than k documents
    top_idx: np.ndarray  # int64 (m, k): corpus indices

    @property
    def activation(self) -> np.ndarray:
        return activation_mask(self.top_sims, self.top_idx, len(self.lse))


def activation_mask(top_sims: np.ndarray, top_idx: np.ndarray, n: int) -> np.ndarray:
    """The union of the members' top-k documents, as a bool mask over n documents."""
    mask = np.zeros(n, dtype=bool)
    mask[top_idx[np.isfinite(top_sims)]] = True
    return mask


def bank_statistics(
    bank: np.ndarray,
    docs: np.ndarray,
    beta: float,
    k: int = 1,
    self_idx: np.ndarray | None = None,
    bank_chunk: int = 2048,
    doc_chunk: int = 4096,
) -> BankFit:
    """Per-document LSE_d = logsumexp_b beta * s(b, d), and each bank member's top-k documents.

    Streams over (bank chunk x document chunk) products with an online logsumexp, so memory stays
    at one chunk product however large the bank. `self_idx[i]` is the corpus index of bank member i's own
    document when the bank is drawn from the corpus (gallery bank; -1: not in the corpus): that self-match is
    excluded from both.
    """
    n = len(docs)
    run_max = np.full(n, -np.inf)
    run_sum = np.zeros(n)
    top_idx = np.full((len(bank), k), -1, dtype=np.int64)
    top_val = np.full((len(bank), k), -np.inf, dtype=np.float32)
    for d0 in range(0, n, doc_chunk):
        doc_block = np.ascontiguousarray(docs[d0 : d0 + doc_chunk], dtype=np.float32)
        cols = np.arange(d0, d0 + len(doc_block))
        for b0 in range(0, len(bank), bank_chunk):
            sims = np.ascontiguousarray(bank[b0 : b0 + bank_chunk], dtype=np.float32) @ doc_block.T
            if self_idx is not None:
                rows, hit = np.nonzero(self_idx[b0 : b0 + len(sims), None] == cols[None, :])
                sims[rows, hit] = -np.inf
            _update_lse(run_max[d0 : d0 + len(doc_block)], run_sum[d0 : d0 + len(doc_block)], beta * sims.astype(np.float64))
            update_top_k(top_val[b0 : b0 + len(sims)], top_idx[b0 : b0 + len(sims)], sims, cols)
    return BankFit(run_max + np.log(run_sum), top_val, top_idx)


def _update_lse(run_max: np.ndarray, run_sum: np.ndarray, logits: np.ndarray) -> None:
    """Fold a (bank rows x docs) block of logits into running per-document max and scaled sums."""
    block_max = logits.max(axis=0)
    new_max = np.maximum(run_max, block_max)
    safe = np.where(np.isfinite(new_max), new_max, 0.0)
    run_sum *= np.exp(np.where(np.isfinite(run_max), run_max - safe, -np.inf))
    run_sum += np.exp(logits - safe).sum(axis=0)
    run_max[:] = new_max


def update_top_k(top_val: np.ndarray, top_idx: np.ndarray, sims: np.ndarray, keys: np.ndarray) -> None:
    """Merge a (members x documents) block of similarities into each member's top-k; `keys` name the block's columns."""
    k = top_val.shape[1]
    if sims.shape[1] == 0:
        return
    take = min(k, sims.shape[1])
    part = np.argpartition(-sims, take - 1, axis=1)[:, :take]
    vals = np.concatenate([top_val, np.take_along_axis(sims, part, axis=1)], axis=1)
    idx = np.concatenate([top_idx, keys[part]], axis=1)
    best = np.argsort(-vals, axis=1, kind="stable")[:, :k]
    top_val[:] = np.take_along_axis(vals, best, axis=1)
    top_idx[:] = np.where(np.isfinite(top_val), np.take_along_axis(idx, best, axis=1), -1)


@dataclass(frozen=True)
class HubnessParams:
    beta: float = 20.0  # QB-Norm
    beta1: float = 1 / 1.99  # DBNorm query bank
    beta2: float = 3.0  # DBNorm gallery bank
    k: int = 1  # activation top-k

    def __post_init__(self) -> None:
        for name in ("beta", "beta1", "beta2"):
            object.__setattr__(self, name, checks.number(name, getattr(self, name), 0, above=True))
        object.__setattr__(self, "k", checks.number("k", self.k, 1, integer=True))


@dataclass(frozen=True)
class Banks:
    """What a correction was fitted with, kept with it so that documents written later (indexer.live) get their
    biases and activation from the same banks: a fresh fit of the changed collection with these banks agrees."""

    query: np.ndarray  # (m, dimension) query bank
    gallery: np.ndarray  # (g, dimension) gallery bank: vectors of documents sampled at fit time
    gallery_ids: list[str]  # their ids: a gallery member never counts towards the document with its id
    neighbours: dict[str, tuple[np.ndarray, np.ndarray]]  # "query" / "gallery" -> each member's (top sims, top doc idx)


@dataclass
class HubnessCorrection:
    """Fitted biases and activation sets; turns raw cosines into corrected scores."""

    params: HubnessParams
    lse: dict[str, np.ndarray]  # column name -> (n,) LSE over that bank, at that bank's beta
    activation: dict[str, np.ndarray]  # "query" / "gallery" -> (n,) bool
    alive: np.ndarray | None = None  # bool (n,): the documents that exist (a live collection); None: all

    def coefficients(self, method: str, dynamic: bool, raw_top1: int | None) -> np.ndarray:
        """Weights of the bias columns for one query: corrected = s - coefficients . LSE."""
        return self.coefficients_for(method, *self.active_banks(dynamic, raw_top1))

    def active_banks(self, dynamic: bool, raw_top1: int | None) -> tuple[bool, bool]:
        """(query bank applies, gallery bank applies): always for IS, by the raw top-1 for DIS."""
        if not dynamic:
            return True, True

        def applies(bank: str) -> bool:
            return raw_top1 is not None and bool(self.activation[bank][raw_top1])

        return applies("query"), applies("gallery")

    def coefficients_for(self, method: str, use_query: bool, use_gallery: bool) -> np.ndarray:
        coef = np.zeros(len(BIAS_COLUMNS))
        if method == "qbnorm":
            if use_query:
                coef[0] = 1.0 / self.params.beta
        elif method == "dbnorm":
            total_beta = self.params.beta1 * use_query + self.params.beta2 * use_gallery
            if use_query:
                coef[1] = 1.0 / total_beta
            if use_gallery:
                coef[2] = 1.0 / total_beta
        elif method != "none":
            raise ConfigError(f"unknown hubness method {method!r}; valid: {', '.join(HUBNESS_METHODS)}")
        return coef

    def bias_matrix(self) -> np.ndarray:
        """(n, len(BIAS_COLUMNS)) of LSE values; columns of unfitted methods are 0."""
        n = len(next(iter(self.lse.values())))
        return np.column_stack([self.lse.get(c, np.zeros(n)) for c in BIAS_COLUMNS])

    def corrected(self, raw: np.ndarray, doc_idx: np.ndarray, coef: np.ndarray) -> np.ndarray:
        """Corrected scores of `doc_idx` given their raw cosines `raw`."""
        bias = sum(c * self.lse[name][doc_idx] for c, name in zip(coef, BIAS_COLUMNS) if c)
        corrected: np.ndarray = np.asarray(raw, dtype=np.float64) - bias
        return corrected

    def score_floor(self, coef: np.ndarray) -> float:
        """A lower bound of corrected scores (cosine floor -1 minus the largest bias of a document that exists): for tmm."""
        return score_floor(coef, self.max_bias)

    @functools.cached_property
    def max_bias(self) -> dict[str, float]:
        """Per bias column, its largest value over the documents that exist."""
        return {name: float((lse if self.alive is None else lse[self.alive]).max()) for name, lse in self.lse.items()}


def score_floor(coef: np.ndarray, max_bias: dict[str, float]) -> float:
    """-1 (the cosine floor) minus the largest bias the coefficients can subtract."""
    return -1.0 - float(sum(c * max_bias[name] for c, name in zip(coef, BIAS_COLUMNS) if c))


def augment_documents(vectors: np.ndarray, correction: HubnessCorrection) -> np.ndarray:
    """d' = [d, -LSE columns]: inner product with q' = [q, coef] is s(q, d) - coef . LSE(d)."""
    return np.hstack([vectors, -correction.bias_matrix()]).astype(np.float32)


def augment_query(vector: np.ndarray, coef: np.ndarray) -> np.ndarray:
    return np.concatenate([vector, coef]).astype(np.float32)


def k_occurrence(rankings: list[Ranking], num_docs: int, k: int = 10) -> np.ndarray:
    """N_k(d): how many queries have d in their top k."""
    counts = np.zeros(num_docs, dtype=np.int64)
    for ranking in rankings:
        np.add.at(counts, ranking.doc_idx[:k], 1)
    return counts


def hubness_stats(counts: np.ndarray) -> dict[str, float]:
    """Skewness of the k-occurrence distribution and the share of documents never retrieved."""
    mean, std = counts.mean(), counts.std()
    skew = float(((counts - mean) ** 3).mean() / std**3) if std > 0 else 0.0
    return {"skewness": round(skew, 4), "never_retrieved": round(float((counts == 0).mean()), 4), "max_occurrence": int(counts.max())}


class ExactSearchable(Protocol):
    """What the searcher needs of the augmented index: search.dense.DenseIndex, or segments.LiveDense."""

    def brute_force(self, allowed: Allowed) -> bool: ...

    def search(self, query: np.ndarray, depth: int, allowed: Allowed | None = None) -> Ranking: ...


class HubnessSearcher:
    """Exact corrected top-k over the whole corpus through the augmented inner-product index."""

    def __init__(self, correction: HubnessCorrection, augmented: ExactSearchable, banks: Banks | None = None) -> None:
        self.correction, self.augmented = correction, augmented  # augmented: search.dense.DenseIndex (or LiveDense)
        self.banks = banks  # None: fitted before banks were kept (a live collection cannot extend the correction)
        self.alive = Allowed(correction.alive) if correction.alive is not None else None  # of a live collection

    def search(
        self,
        vector: np.ndarray,
        depth: int,
        method: str,
        dynamic: bool,
        allowed: Allowed | None = None,
        embeddings: np.ndarray | None = None,
    ) -> tuple[Ranking, np.ndarray]:
        """Corrected top-`depth` and the bias coefficients used for this query.

        Dynamic variants search the raw scores first: when the raw top-1 activates no bank, that is the
        answer; otherwise a second search applies the correction. (Batching both queries into one call,
        or a NumPy matvec for the top-1, measured slower in the service: both wake a second thread pool,
        OpenMP or OpenBLAS, that competes with ONNX Runtime's for the same cores.)

        With a filter (`allowed`), the same coefficients (DIS decides on the raw top-1 of the whole corpus, every
        document that exists, so a filter never changes an admitted document's score) and the top-`depth` among the
        allowed documents: scored exactly from `embeddings` when the cost rule says so (DenseIndex.brute_force).
        """
        if dynamic and method != "none":
            raw = self._raw(vector, 1 if allowed is not None else depth, embeddings)
            coef = self.correction.coefficients(method, True, int(raw.doc_idx[0]) if len(raw) else None)
            if not coef.any() and allowed is None:
                return raw, coef
        else:
            coef = self.correction.coefficients(method, False, None)
        return self.search_with(vector, depth, coef, allowed, embeddings), coef

    def search_with(
        self, vector: np.ndarray, depth: int, coef: np.ndarray, allowed: Allowed | None = None, embeddings: np.ndarray | None = None
    ) -> Ranking:
        """The corrected top-`depth` (of the allowed documents) with the bias coefficients given: a shard searches with
        the coefficients its coordinator chose from the whole corpus (search.sharded)."""
        if allowed is not None and self.augmented.brute_force(allowed):
            assert embeddings is not None  # a brute-force search scores the stored vectors
            corrected = lambda ids: self.correction.corrected(embeddings[ids] @ vector, ids, coef)
            return exact_top_k(corrected, allowed.ids, depth)
        return self.augmented.search(augment_query(vector, coef), depth, allowed)

    def raw_top1(self, vector: np.ndarray, embeddings: np.ndarray) -> tuple[int, float] | None:
        """(document, cosine) of the uncorrected best document that exists, which decides a dynamic variant's banks."""
        raw = self._raw(vector, 1, embeddings)
        return (int(raw.doc_idx[0]), float(raw.scores[0])) if len(raw) else None

    def _raw(self, vector: np.ndarray, depth: int, embeddings: np.ndarray | None) -> Ranking:
        """The uncorrected top-`depth` of the documents that exist (by the same cost rule as a filter)."""
        if self.alive is not None and self.augmented.brute_force(self.alive):
            assert embeddings is not None  # a brute-force search scores the stored vectors
            return exact_top_k(lambda ids: embeddings[ids] @ vector, self.alive.ids, depth)
        return self.augmented.search(augment_query(vector, np.zeros(len(BIAS_COLUMNS))), depth, self.alive)
