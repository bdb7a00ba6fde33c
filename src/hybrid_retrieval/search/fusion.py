"""Fusion of BM25 and dense candidates into one ranking.

Reciprocal Rank Fusion (Cormack, Clarke, Buettcher, SIGIR 2009):
    rrf(d) = sum over retrievers o of  w_o / (rrf_k + rank_o(d)),   ranks start at 1;
    a document outside retriever o's top-`depth` list gets nothing from o.
Convex combination (Bruch, Gai, Ingber, ACM TOIS 2023):
    cc(d) = alpha * phi(s_dense(d)) + (1 - alpha) * phi(s_bm25(d)),
    phi a per-query normalisation over the candidates (see search.normalize).

The default, for an index nobody tuned, is the convex combination with equal weights of z-scores: each leg's
scores in units of their own spread over the query's candidates, so neither scale nor a corpus constant decides
the balance (it ranks like Qdrant's distribution-based fusion). Its evidence: docs/relevance.md "The default fusion".

Every candidate carries both raw scores (the BM25 score of a dense-only document is read from the
BM25 index, the cosine of a BM25-only document from its stored vector): nothing is imputed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np

from hybrid_retrieval.common.errors import SpecError
from hybrid_retrieval.search import checks
from hybrid_retrieval.search.normalize import NORMALIZERS, THEORETICAL_MIN, normalize
from hybrid_retrieval.search.ranking import Ranking, top_k

DEFAULT_RRF_K = 60.0
MAX_RRF_K = 1e6
MAX_RRF_WEIGHT = 1e6  # any ratio of weights that matters, and sums that stay finite even with rrf_k = 0
RETRIEVERS = ("bm25", "dense")


@dataclass(frozen=True)
class RRF:
    rrf_k: float = DEFAULT_RRF_K
    weights: tuple[float, float] = (1.0, 1.0)  # (bm25, dense)
    method: str = "rrf"

    def __post_init__(self) -> None:
        object.__setattr__(self, "rrf_k", checks.number("rrf_k", self.rrf_k, 0, MAX_RRF_K))
        if isinstance(self.weights, (str, bytes)) or not hasattr(self.weights, "__len__") or len(self.weights) != 2:
            raise SpecError("weights", f"must be two numbers from 0 to {MAX_RRF_WEIGHT:g} [bm25, dense], got {self.weights!r}"[:200])
        object.__setattr__(self, "weights", tuple(checks.number("weights", w, 0, MAX_RRF_WEIGHT) for w in self.weights))


@dataclass(frozen=True)
class ConvexCombination:
    alpha: float = 0.5  # weight of the dense retriever
    norm: str = "zscore"
    method: str = "cc"

    def __post_init__(self) -> None:
        object.__setattr__(self, "alpha", checks.number("alpha", self.alpha, 0, 1))
        checks.choice("norm", self.norm, tuple(NORMALIZERS))


Fusion = RRF | ConvexCombination
FUSIONS: dict[str, type[RRF] | type[ConvexCombination]] = {"rrf": RRF, "cc": ConvexCombination}
DEFAULT_FUSION: Fusion = ConvexCombination()


# The one place where fusions turn into and out of their dict form (manifest, API, reports) and their
# string form (`hybrid eval --pipelines`, tuning tables).


def fusion_to_dict(fusion: Fusion) -> dict[str, Any]:
    values = asdict(fusion)
    if "weights" in values:
        values["weights"] = list(values["weights"])
    return {"method": values.pop("method"), **values}


def fusion_from_dict(spec: dict[str, Any], base: Fusion | None = None) -> Fusion:
    """A fusion from its (possibly partial) dict form. Fields not given come from `base` when it is the
    same method, else from that method's defaults. A missing `method` means base's, or the one method whose
    fields were given when base has none of them or there is no base (`{"rrf_k": 30}` is RRF whatever the
    default). Errors name the field."""
    if not isinstance(spec, dict):
        raise SpecError("method", f"a fusion is an object with a method ({', '.join(FUSIONS)}), got {spec!r}")
    values = dict(spec)
    method = values.pop("method", None)
    if method is None:
        owners = [name for name, cls in FUSIONS.items() if values and set(values) <= _field_names(cls)]
        method = owners[0] if len(owners) == 1 and (base is None or base.method not in owners) else getattr(base, "method", None)
    cls = FUSIONS.get(method) if isinstance(method, str) else None
    if cls is None:
        raise SpecError("method", f"unknown fusion method {method!r}; valid: {', '.join(FUSIONS)}")
    known = sorted(_field_names(cls))
    for name in values:
        if name not in known:
            raise SpecError(name, f"not a field of {method} fusion; valid: {', '.join(known)}")
    inherited = {k: v for k, v in asdict(base).items() if k != "method"} if base is not None and isinstance(base, cls) else {}
    return cls(**{**inherited, **values})


def _field_names(cls: type[RRF] | type[ConvexCombination]) -> set[str]:
    return {f.name for f in fields(cls) if f.name != "method"}


def fusion_to_string(fusion: Fusion) -> str:
    if isinstance(fusion, RRF):
        weights = "" if fusion.weights == (1.0, 1.0) else ":w=" + ",".join(map(checks.compact, fusion.weights))
        return f"rrf:{checks.compact(fusion.rrf_k)}{weights}"
    return f"cc:{fusion.norm}:{checks.compact(fusion.alpha)}"


def fusion_from_string(text: str) -> dict[str, Any]:
    """`rrf[:RRF_K[:w=BM25,DENSE]]` or `cc[:NORM[:ALPHA]]` -> the partial dict form (checked when built)."""
    method, *params = text.split(":")
    if method == "rrf" and len(params) <= 2:
        spec: dict[str, Any] = {"method": "rrf"}
        if params:
            spec["rrf_k"] = checks.parse_number("rrf_k", params[0])
        if len(params) == 2:
            if not params[1].startswith("w="):
                raise SpecError("weights", f"expected w=BM25,DENSE, got {params[1]!r}")
            spec["weights"] = [checks.parse_number("weights", w) for w in params[1][2:].split(",")]
        return spec
    if method == "cc" and len(params) <= 2:
        spec = {"method": "cc"}
        if params:
            spec["norm"] = params[0]
        if len(params) == 2:
            spec["alpha"] = checks.parse_number("alpha", params[1])
        return spec
    raise SpecError("method", f"unknown fusion {text!r}; valid: rrf[:RRF_K[:w=BM25,DENSE]], cc[:NORM[:ALPHA]]")


@dataclass(frozen=True)
class Candidates:
    """The union of both retrievers' top-depth lists, each document with both raw scores.

    Arrays are aligned with `doc_idx` (sorted ascending). Ranks count from 1; 0 means the document
    was not in that retriever's top-depth list.
    """

    doc_idx: np.ndarray
    scores: dict[str, np.ndarray]
    ranks: dict[str, np.ndarray]
    floors: dict[str, float]  # theoretical minimum of each retriever's scores (for tmm)
    rankings: dict[str, Ranking] | None = None  # each retriever's top-depth list, as it ranked it

    def __len__(self) -> int:
        return len(self.doc_idx)

    @classmethod
    def from_rankings(
        cls, rankings: dict[str, Ranking], score_of: dict[str, Callable[[np.ndarray], np.ndarray]], floors: dict[str, float] | None = None
    ) -> Candidates:
        """`score_of[name](doc_idx)` returns that retriever's raw scores for any documents."""
        doc_idx = np.unique(np.concatenate([r.doc_idx for r in rankings.values()]))
        ranks = {name: _ranks_in(r, doc_idx) for name, r in rankings.items()}
        scores = {name: np.asarray(score_of[name](doc_idx), dtype=np.float64) for name in rankings}
        return cls(doc_idx, scores, ranks, {**THEORETICAL_MIN, **(floors or {})}, rankings)


def _ranks_in(ranking: Ranking, doc_idx: np.ndarray) -> np.ndarray:
    ranks = np.zeros(len(doc_idx), dtype=np.int64)
    ranks[np.searchsorted(doc_idx, ranking.doc_idx)] = np.arange(1, len(ranking) + 1)
    return ranks


@dataclass(frozen=True)
class Fused:
    """Fused scores and each retriever's additive contribution, aligned with the candidates."""

    candidates: Candidates
    scores: np.ndarray
    contributions: dict[str, np.ndarray]
    normalized: dict[str, np.ndarray] | None  # cc only

    def ranking(self) -> Ranking:
        order = top_k(self.scores, len(self.scores))  # ties: lower doc_idx first (doc_idx is sorted)
        return Ranking(self.candidates.doc_idx[order.doc_idx], order.scores)


def rrf_contributions(ranks: np.ndarray, rrf_k: float, weight: float) -> np.ndarray:
    """w / (rrf_k + rank) where ranked, 0 where the retriever did not return the document."""
    return np.where(ranks > 0, weight / (rrf_k + np.maximum(ranks, 1)), 0.0)


def fuse(candidates: Candidates, fusion: Fusion) -> Fused:
    if isinstance(fusion, RRF):
        contributions = {
            name: rrf_contributions(candidates.ranks[name], fusion.rrf_k, weight) for name, weight in zip(RETRIEVERS, fusion.weights)
        }
        normalized = None
    else:
        normalized = {name: normalize(candidates.scores[name], fusion.norm, candidates.floors[name]) for name in RETRIEVERS}
        contributions = {"dense": fusion.alpha * normalized["dense"], "bm25": (1 - fusion.alpha) * normalized["bm25"]}
    total = contributions["bm25"] + contributions["dense"]
    return Fused(candidates, total, contributions, normalized)
