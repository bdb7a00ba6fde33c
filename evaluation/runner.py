"""Run a search pipeline over a query set and produce TREC-style runs."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tqdm import tqdm

from indexer.store import OpenIndex
from search.fusion import RRF, ConvexCombination, Fusion
from search.pipeline import MODES, HubnessChoice, SearchPipeline
from search.ranking import Ranking
from search.rerank import Reranker, check_weight


def doc_ids(index: OpenIndex) -> list[str]:
    return [index.docs.get(i)["id"] for i in range(index.num_docs)]


@dataclass(frozen=True)
class RerankChoice:
    precision: str = "fp32"  # fp32 | int8 (ONNX weights)
    weight: float | None = None  # interpolation weight; None: the model's tuned weight, else 1


def parse_pipeline(spec: str) -> tuple[str, Fusion | None, HubnessChoice, RerankChoice | None]:
    """`bm25`, `dense`, `hybrid` (index default), `rrf[:RRF_K]` or `cc:NORM:ALPHA`, optionally followed by
    `+qbnorm`, `+dbnorm`, `+qbnorm:dis`, `+dbnorm:dis` (hubness correction) and
    `+rerank[:int8][:w=WEIGHT]` (cross-encoder) -> (mode, fusion, hubness, rerank or None)."""
    spec, *extras = spec.split("+")
    hubness, rerank = HubnessChoice(), None
    for extra in extras:
        method, _, variant = extra.partition(":")
        if method == "rerank":
            rerank = _parse_rerank(variant, extra)
        elif method in ("qbnorm", "dbnorm") and variant in ("", "dis"):
            hubness = HubnessChoice(method, variant == "dis")
        else:
            raise ValueError(f"unknown {extra!r} in pipeline; valid: qbnorm, dbnorm, qbnorm:dis, dbnorm:dis, rerank[:int8][:w=WEIGHT]")
    mode, fusion = _parse_retrieval(spec)
    return mode, fusion, hubness, rerank


def _parse_rerank(variant: str, extra: str) -> RerankChoice:
    precision, weight = "fp32", None
    for part in filter(None, variant.split(":")):
        if part in ("fp32", "int8"):
            precision = part
        elif part.startswith("w=") and weight is None and _unit_float(part[2:]) is not None:
            weight = _unit_float(part[2:])
        else:
            raise ValueError(f"unknown {part!r} in {extra!r}; valid: rerank[:fp32|int8][:w=WEIGHT], WEIGHT from 0 to 1, once")
    return RerankChoice(precision, weight)


def _unit_float(text: str) -> float | None:
    try:
        return check_weight(float(text))
    except ValueError:
        return None


def hubness_pipelines() -> list[str]:
    """Dense and hybrid, each with no correction and with every hubness variant."""
    variants = ("", "+qbnorm", "+qbnorm:dis", "+dbnorm", "+dbnorm:dis")
    return [f"{base}{v}" for base in ("dense", "hybrid") for v in variants]


def _parse_retrieval(spec: str) -> tuple[str, Fusion | None]:
    name, *params = spec.split(":")
    try:
        if name in MODES and not params:
            return name, None
        if name == "rrf" and len(params) <= 1:
            return "hybrid", RRF(rrf_k=float(params[0]) if params else RRF().rrf_k)
        if name == "cc" and len(params) == 2:
            return "hybrid", ConvexCombination(norm=params[0], alpha=float(params[1]))
    except ValueError as exc:
        raise ValueError(f"pipeline {spec!r}: {exc}") from None
    raise ValueError(f"unknown pipeline {spec!r}; valid: bm25, dense, hybrid, rrf[:RRF_K], cc:NORM:ALPHA")


def tuned_pipelines(manifest: dict) -> list[str]:
    """Pipeline specs for every fusion in the index's tuning record (empty when untuned)."""
    tuning = manifest["fusion"].get("tuning")
    if not tuning:
        return []
    specs = ["rrf:60", f"rrf:{tuning['best_rrf_k']:g}"]
    return specs + [f"cc:{norm}:{alpha:g}" for norm, alpha in tuning["best_per_norm"].items()]


class CachedScorer:
    """Remembers cross-encoder scores by (query, text): pipelines evaluated side by side share most pairs."""

    def __init__(self, model):
        self.model, self.max_length = model, model.max_length
        self._scores: dict[tuple[str, str], float] = {}

    def score(self, query: str, texts, batch_size: int = 32):
        missing = list(dict.fromkeys(t for t in texts if (query, t) not in self._scores))
        if missing:
            self._scores.update(zip(((query, t) for t in missing), self.model.score(query, missing, batch_size).tolist()))
        return np.array([self._scores[(query, t)] for t in texts], dtype=np.float32)


def run_queries(pipeline: SearchPipeline, ids: list[str], queries: dict[str, str], mode: str,
                fusion: Fusion | None = None, hubness: HubnessChoice | None = None, k: int = 100, progress: bool = False,
                reranker: Reranker | None = None, rerank_weight: float | None = None):
    """{query_id: {doc_id: score}} and the rankings (internal indices), in query order.

    With a reranker, its top `depth` replace the head of the first-stage top-k and the rest keep
    their order below (scores shifted under the lowest reranker score), so recall@k stays comparable."""
    run, rankings = {}, []
    for qid, text in tqdm(queries.items(), desc=mode, unit=" q", disable=not progress):
        ranking = pipeline.search(text, k=k, mode=mode, fusion=fusion, hubness=hubness or HubnessChoice(), rerank=False).ranking
        if reranker is not None:
            ranking = _rerank_head(reranker, text, ranking, rerank_weight)
        run[qid] = {ids[int(i)]: float(s) for i, s in zip(ranking.doc_idx, ranking.scores)}
        rankings.append(ranking)
    return run, rankings


def _rerank_head(reranker: Reranker, query: str, ranking: Ranking, weight: float | None) -> Ranking:
    depth = reranker.options.depth
    head = reranker.rerank(query, ranking.head(depth), weight).ranking
    tail = ranking.scores[depth:]
    if not len(tail):
        return head
    shifted = tail - tail.max() + float(head.scores.min()) - 1.0
    return Ranking(np.concatenate([head.doc_idx, ranking.doc_idx[depth:]]), np.concatenate([head.scores, shifted]))
