"""What writes cost a sharded index, in one process: the same hybrid searches on the whole index and on its splits,
before and after a write (after one, every BM25 leg first sums the shards' corpus statistics of the query's terms),
and the rate at which each takes the same upserts (each shard's writer embeds and logs its own documents).

The index is copied first: nothing is written to the source. The writes are re-upserts of the index's first documents,
unchanged, so the corpus (and every answer) stays the same and each answer is checked against the whole index's.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

from bench.harness import Case, Table, interleaved, percentiles
from hybrid_retrieval.indexer.live.collection import Collection
from hybrid_retrieval.indexer.shards.open import open_sharded
from hybrid_retrieval.indexer.shards.split import split_index
from hybrid_retrieval.indexer.shards.writes import ShardedCollection
from hybrid_retrieval.indexer.store import open_index


def run(index_dir: Path, queries: list[str], shard_counts: list[int] = (2, 4, 8), write_docs: int = 64) -> dict:
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
        documents = [
            {"id": doc["id"], "title": doc["title"], "text": doc["text"], "metadata": doc["metadata"]}
            for doc in map(base.docs.get, range(write_docs))
        ]
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
    return {
        "documents": base.num_docs,
        "queries": len(queries),
        "write_docs": write_docs,
        "rows": {name: {"before": before[name], "after": after[name], "upserts_per_s": rates[name]} for name in before},
    }


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
    return {
        name: {**percentiles(times[name]), "same_answers": sum(answers[name][q] == answers["whole"][q] for q in queries)}
        for name in pipelines
    }


def _shard_writes(ctx) -> list[Table]:
    # the untuned index: a fitted hubness correction would refuse the split index writes (its shards lack the banks)
    r = run(ctx.untuned_index, ctx.queries()[: ctx.size(100, 10)], [2, 4, 8] if not ctx.quick else [2], ctx.size(64, 8))
    rows, whole_after = r["rows"], r["rows"]["whole"]["after"]["p50_ms"]
    table = [
        {
            "index": name,
            "p50 ms before": row["before"]["p50_ms"],
            "p50 ms after": row["after"]["p50_ms"],
            "p99 ms after": row["after"]["p99_ms"],
            "after, ratio to whole after": round(row["after"]["p50_ms"] / whole_after, 3),
            "answers equal (after)": f"{row['after']['same_answers']} of {r['queries']}",
            "upserts/s": row["upserts_per_s"],
        }
        for name, row in rows.items()
    ]
    return [
        Table(
            f"hybrid k=10 over the {r['documents']}-document index whole and split, {r['queries']} queries "
            f"interleaved, before and after one batch of {r['write_docs']} upserts (re-upserts of unchanged "
            "documents, so every answer is checked against the whole index's)",
            table,
            "After a write each BM25 leg of a sharded index first sums the shards' statistics of the query's terms, "
            "and the whole index scores its live segment from postings.",
        )
    ]


CASES = [Case("Scale-out", "Writes on a sharded index", "searches and upserts on the index whole and split, in one process", _shard_writes)]
