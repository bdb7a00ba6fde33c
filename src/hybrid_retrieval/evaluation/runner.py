"""Evaluation pipelines: a search spec in its string form (search.spec), optionally `@int8` for the
reranker's int8 ONNX weights, run over a query set into TREC-style runs."""

from __future__ import annotations

from dataclasses import dataclass

from tqdm import tqdm

from hybrid_retrieval.common.errors import SpecError
from hybrid_retrieval.indexer.manifest import Manifest
from hybrid_retrieval.models.onnx_export import PRECISIONS
from hybrid_retrieval.search.fusion import RRF, ConvexCombination, fusion_to_string
from hybrid_retrieval.search.pipeline import SearchPipeline
from hybrid_retrieval.search.spec import parse_spec_string


@dataclass(frozen=True)
class Pipeline:
    name: str  # as the user wrote it: the report's row
    spec: dict  # partial spec, merged onto the index's (and reranker's) defaults
    precision: str = "fp32"  # reranker weights

    @property
    def reranks(self) -> bool:
        return bool(self.spec.get("rerank", {}).get("enabled"))

    @property
    def first_stage(self) -> str | None:
        """The name of the same pipeline without reranking (None: it does not rerank)."""
        if not self.reranks:
            return None
        return "+".join(part for part in self.name.split("@")[0].split("+") if part.partition(":")[0] != "rerank")


def parse_pipeline(name: str) -> Pipeline:
    """`SPEC[@PRECISION]`, e.g. `hybrid`, `cc:zscore:0.45`, `dense+qbnorm:dis`, `hybrid+rerank:w=0.5@int8`."""
    text, _, precision = name.partition("@")
    if precision and precision not in PRECISIONS:
        raise SpecError("precision", f"unknown reranker precision {precision!r} in {name!r}; valid: {', '.join(PRECISIONS)}")
    pipeline = Pipeline(name, parse_spec_string(text), precision or "fp32")
    if precision and not pipeline.reranks:
        raise SpecError("precision", f"{name!r}: @{precision} chooses the reranker's weights; the pipeline does not rerank")
    return pipeline


def hubness_pipelines() -> list[str]:
    """Dense and hybrid, each with no correction and with every hubness variant."""
    variants = ("+nohub", "+qbnorm", "+qbnorm:dis", "+dbnorm", "+dbnorm:dis")
    return [f"{base}{v}" for base in ("dense", "hybrid") for v in variants]


def tuned_pipelines(manifest: Manifest) -> list[str]:
    """Pipelines for every fusion in the index's tuning record (empty when untuned)."""
    tuning = manifest.fusion_tuning
    if not tuning:
        return []
    fusions = [RRF(), RRF(rrf_k=tuning.best_rrf_k)] + [ConvexCombination(alpha, norm) for norm, alpha in tuning.best_per_norm.items()]
    return [fusion_to_string(fusion) for fusion in fusions]


def run_queries(
    pipeline: SearchPipeline, ids: list[str], queries: dict[str, str], spec: dict, k: int = 100, progress: bool = False, name: str = ""
):
    """{query_id: {doc_id: score}} and the rankings (internal indices), in query order."""
    resolved = pipeline.resolve(spec)
    run, rankings = {}, []
    for qid, text in tqdm(queries.items(), desc=name, unit=" q", disable=not progress):
        ranking = pipeline.search(text, k=k, spec=resolved).ranking
        run[qid] = {ids[int(i)]: float(s) for i, s in zip(ranking.doc_idx, ranking.scores)}
        rankings.append(ranking)
    return run, rankings
