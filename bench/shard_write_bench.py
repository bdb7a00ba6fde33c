"""What writes cost a sharded index, in one process: the same hybrid searches on the whole index and on its splits,
before and after a write (after one, every BM25 leg first sums the shards' corpus statistics of the query's terms),
and the rate at which each takes the same upserts (each shard's writer embeds and logs its own documents).

    python -m bench.shard_write_bench INDEX DATA/scifact [--queries 100] [--shards 2 4 8] [--write-docs 64]
        [--out writes.json] [--markdown] [--benchmarks docs/BENCHMARKS.md]

The index is copied first: nothing is written to INDEX. The writes are re-upserts of the index's first documents,
unchanged, so the corpus (and every answer) stays the same and each answer is checked against the whole index's.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

from bench.harness import interleaved
from bench.harness import percentiles
from hybrid_retrieval.evaluation.report import add_output_flags, emit
from hybrid_retrieval.indexer.corpus import split_queries
from hybrid_retrieval.indexer.live import Collection
from hybrid_retrieval.indexer.shards import ShardedCollection, open_sharded, split_index
from hybrid_retrieval.indexer.store import open_index


def run(index_dir: Path, dataset: Path, n_queries: int = 100, shard_counts: list[int] = (2, 4, 8),
        write_docs: int = 64) -> dict:
    queries = list(split_queries(dataset, "test")[0].values())[:n_queries]
    with tempfile.TemporaryDirectory(prefix="shard-write-bench-") as tmp:
        work = Path(tmp)
        shutil.copytree(index_dir, work / "whole")
        whole = Collection(open_index(work / "whole", verify="size"))
        sharded = {}
        for count in shard_counts:
            split_index(work / "whole", work / f"shards-{count}", count, verify="size")
            index = open_sharded(work / f"shards-{count}", verify="size")
            sharded[f"{count} shards"] = (index, ShardedCollection(index, max_batch_docs=write_docs))
        base = whole.index
        documents = [{"id": doc["id"], "title": doc["title"], "text": doc["text"], "metadata": doc["metadata"]}
                     for doc in map(base.docs.get, range(write_docs))]
        try:
            before = _searches(whole, sharded, queries)
            rates = {}
            for name, writer in [("whole", whole), *((name, c) for name, (_, c) in sharded.items())]:
                started = time.perf_counter()
                writer.upsert(documents)
                writer.refresh()
                rates[name] = round(write_docs / (time.perf_counter() - started), 1)
            after = _searches(whole, sharded, queries)
        finally:
            for index, _ in sharded.values():
                index.close()
            whole.close()
    return {"documents": base.num_docs, "queries": len(queries), "write_docs": write_docs,
            "rows": {name: {"before": before[name], "after": after[name], "upserts_per_s": rates[name]} for name in before}}


def _searches(whole: Collection, sharded: dict, queries: list[str]) -> dict:
    """Each configuration's hybrid searches (k=10, the index's defaults), interleaved query by query; p50/p99 and how
    many answers equal the whole index's."""
    snapshot = whole.snapshot
    pipelines = {"whole": snapshot.pipeline(), **{name: index.pipeline() for name, (index, _) in sharded.items()}}
    answers: dict[str, dict[str, list[str]]] = {name: {} for name in pipelines}

    def search(name: str):
        def run_one(query: str):
            ranking = pipelines[name].search(query, 10).ranking
            docs = sharded[name][0].documents(ranking.doc_idx) if name in sharded else map(snapshot.document, ranking.doc_idx)
            answers[name][query] = [doc["id"] for doc in docs]
        return run_one

    times = interleaved({name: search(name) for name in pipelines}, queries)
    return {name: {**percentiles(times[name]), "same_answers": sum(answers[name][q] == answers["whole"][q] for q in queries)}
            for name in pipelines}


def markdown(report: dict) -> str:
    rows = report["rows"]
    whole_before, whole_after = rows["whole"]["before"]["p50_ms"], rows["whole"]["after"]["p50_ms"]
    lines = ["## Writes on a sharded index (`python -m bench.shard_write_bench`)", "",
             f"In one process, the {report['documents']}-document index whole and split: hybrid searches (k=10, the "
             f"index's default spec) of {report['queries']} test queries interleaved query by query, before any write "
             f"and after one batch of {report['write_docs']} upserts (re-upserts of unchanged documents: the same corpus, "
             "so every answer is checked against the whole index's). After a write, each BM25 leg of a sharded index "
             "first sums the shards' statistics of the query's terms (one more call to every shard), and the whole "
             "index scores its live segment the same way (search.segments.LiveBM25). Upserts: the batch's documents "
             "per second, embedding and the durable log included (each shard's writer embeds its own documents).", "",
             "| index | p50 ms before | p50 ms after | p99 ms after | after vs whole after | answers equal (after) | "
             "upserts/s |", "|---|---:|---:|---:|---:|---:|---:|"]
    for name, row in rows.items():
        lines.append(f"| {name} | {row['before']['p50_ms']:.2f} | {row['after']['p50_ms']:.2f} | "
                     f"{row['after']['p99_ms']:.2f} | {row['after']['p50_ms'] / whole_after:.2f}x | "
                     f"{row['after']['same_answers']} of {report['queries']} | {row['upserts_per_s']} |")
    lines += ["", f"The whole index itself: {whole_before:.2f} ms p50 before the write, {whole_after:.2f} after "
              f"({whole_after / whole_before:.2f}x; after a write its BM25 scores from postings, search.segments.LiveBM25, "
              "instead of bm25s's precomputed matrix).", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("index", type=Path)
    parser.add_argument("dataset", type=Path)
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--shards", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--write-docs", type=int, default=64)
    add_output_flags(parser)
    args = parser.parse_args()
    emit(run(args.index, args.dataset, args.queries, args.shards, args.write_docs), markdown, args)


if __name__ == "__main__":
    main()
