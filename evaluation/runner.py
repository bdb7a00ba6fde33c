"""Run a search pipeline over a query set and produce TREC-style runs."""

from __future__ import annotations

from tqdm import tqdm

from indexer.store import OpenIndex
from search.pipeline import SearchPipeline


def doc_ids(index: OpenIndex) -> list[str]:
    return [index.docs.get(i)["id"] for i in range(index.num_docs)]


def run_queries(pipeline: SearchPipeline, ids: list[str], queries: dict[str, str], mode: str, k: int = 100, progress: bool = False):
    """{query_id: {doc_id: score}} and the per-query latency in ms."""
    run, latencies = {}, []
    for qid, text in tqdm(queries.items(), desc=mode, unit=" q", disable=not progress):
        result = pipeline.search(text, k=k, mode=mode)
        run[qid] = {ids[int(i)]: float(s) for i, s in zip(result.ranking.doc_idx, result.ranking.scores)}
        latencies.append(result.timings_ms["total"])
    return run, latencies
