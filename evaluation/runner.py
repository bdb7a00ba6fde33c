"""Run a search pipeline over a query set and produce TREC-style runs."""

from __future__ import annotations

from tqdm import tqdm

from indexer.store import OpenIndex
from search.fusion import RRF, ConvexCombination, Fusion
from search.pipeline import MODES, HubnessChoice, SearchPipeline


def doc_ids(index: OpenIndex) -> list[str]:
    return [index.docs.get(i)["id"] for i in range(index.num_docs)]


def parse_pipeline(spec: str) -> tuple[str, Fusion | None, HubnessChoice]:
    """`bm25`, `dense`, `hybrid` (index default), `rrf[:RRF_K]` or `cc:NORM:ALPHA`, optionally followed by
    `+qbnorm`, `+dbnorm`, `+qbnorm:dis`, `+dbnorm:dis` (hubness correction) -> (mode, fusion, hubness)."""
    spec, _, hub = spec.partition("+")
    hubness = HubnessChoice()
    if hub:
        method, _, variant = hub.partition(":")
        if method not in ("qbnorm", "dbnorm") or variant not in ("", "dis"):
            raise ValueError(f"unknown hubness {hub!r} in pipeline; valid: qbnorm, dbnorm, qbnorm:dis, dbnorm:dis")
        hubness = HubnessChoice(method, variant == "dis")
    mode, fusion = _parse_retrieval(spec)
    return mode, fusion, hubness


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


def run_queries(pipeline: SearchPipeline, ids: list[str], queries: dict[str, str], mode: str,
                fusion: Fusion | None = None, hubness: HubnessChoice | None = None, k: int = 100, progress: bool = False):
    """{query_id: {doc_id: score}} and the rankings (internal indices), in query order."""
    run, rankings = {}, []
    for qid, text in tqdm(queries.items(), desc=mode, unit=" q", disable=not progress):
        result = pipeline.search(text, k=k, mode=mode, fusion=fusion, hubness=hubness or HubnessChoice())
        run[qid] = {ids[int(i)]: float(s) for i, s in zip(result.ranking.doc_idx, result.ranking.scores)}
        rankings.append(result.ranking)
    return run, rankings
