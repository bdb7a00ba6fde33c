"""A million documents on one machine: how each cost grows with the collection.

The haystack (bench.haystack): the dataset's real documents plus reproducible distractors with its term statistics,
at 100k, 300k and 1M documents, so the test queries keep their judgments as the collection grows. Measured here, at
each size, side by side in one run:

  BM25: the index built from the analysed haystack (search.bm25, the bytes it holds a document); top-10 and top-100
  p50 of the exhaustive scorer (every posting of every query term summed) against MaxScore (search.maxscore),
  interleaved query by query over the test queries and 1,000 generated ones, unfiltered and with a 1%-selective
  filter, and as served (search.bm25.worth_pruning picks one of the two); every pruned ranking checked identical to
  the exhaustive one (ids, scores, order); the test queries' nDCG@10 and Recall@100. Each cost's growth is the
  exponent of a power law fitted over the sizes.

  Compressed vectors: the dataset's untuned index searched with its vectors as flat, sq8 and hnsw_sq8 indexes
  (8-bit codes, candidates rescored from the stored vectors): bytes a vector in memory, the dense leg's recall@10
  against flat, and nDCG@10 / Recall@100 of the dense and hybrid modes.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from bench.harness import Case, Table, interleaved, percentiles
from bench.haystack import Haystack
from hybrid_retrieval.indexer.corpus import split_queries
from hybrid_retrieval.indexer.store import open_index
from hybrid_retrieval.quality.metrics import evaluate
from hybrid_retrieval.search.analyzer import Analyzer
from hybrid_retrieval.search.bm25 import BM25Index, BM25Params
from hybrid_retrieval.search.dense import DenseIndex, FaissParams, build_faiss_index
from hybrid_retrieval.search.filters.language import Allowed
from hybrid_retrieval.search.postings import PostingsBuilder
from hybrid_retrieval.search.ranking import Ranking

SIZES = (100_000, 300_000, 1_000_000)
QUICK_SIZES = (6_000, 8_000, 12_000)
GENERATED_QUERIES = 1_000
DEPTHS = (10, 100)


def growth_exponent(sizes: list[int], values: list[float]) -> float:
    """b of the power law value = a * size^b fitted over the sizes (1: linear; 0.5: as the square root)."""
    return round(float(np.polyfit(np.log(sizes), np.log(values), 1)[0]), 3)


def analysed_haystacks(
    haystack: Haystack, sizes: tuple[int, ...], analyzer: Analyzer
) -> tuple[dict[int, PostingsBuilder], list[str], float]:
    """Each size's documents analysed into postings (each document analysed once, the smaller sizes being prefixes),
    every document id, and the seconds it took."""
    builders = {size: PostingsBuilder() for size in sizes}
    ids = []
    started = time.perf_counter()
    for position, doc in enumerate(haystack.documents(max(sizes))):
        tokens = analyzer.analyze(f"{doc['title']} {doc['text']}")
        for size, builder in builders.items():
            if position < size:
                builder.add(tokens)
        ids.append(doc["_id"])
    return builders, ids, time.perf_counter() - started


def identical(a: Ranking, b: Ranking) -> bool:
    return np.array_equal(a.doc_idx, b.doc_idx) and np.array_equal(a.scores, b.scores)


def bm25_at_size(index: BM25Index, queries: list[str], test: dict[str, str], qrels: dict, ids: list[str], rng) -> dict:
    selective = Allowed(rng.random(index.num_docs) < 0.01)
    row: dict = {}
    differing = 0
    for depth in DEPTHS:
        for label, allowed in (("", None), (", 1% filter", selective)):
            exhaustive = lambda q, d=depth, a=allowed: index.ranking_from_scores(index.scores(q), d, a)
            pruned = lambda q, d=depth, a=allowed: index.leg(q, d, a, prune=True)[0]
            served = lambda q, d=depth, a=allowed: index.leg(q, d, a)[0]  # search.bm25.worth_pruning chooses
            times = interleaved({"exhaustive": exhaustive, "maxscore": pruned, "served": served}, queries)
            differing += sum(not identical(exhaustive(q), pruned(q)) for q in queries)
            row[f"top-{depth}{label}"] = {name: percentiles(t) for name, t in times.items()}
    run = {}
    for qid, text in test.items():
        ranking = index.leg(text, 100, prune=True)[0]
        run[qid] = {ids[i]: float(s) for i, s in zip(ranking.doc_idx.tolist(), ranking.scores.tolist())}
    quality = evaluate(run, qrels, ("ndcg@10", "recall@100"))
    return {"latency": row, "differing_rankings": differing, "compared": len(queries) * len(DEPTHS) * 2, "quality": quality}


def _bm25(ctx) -> list[Table]:
    sizes = QUICK_SIZES if ctx.quick else SIZES
    haystack = Haystack(ctx.data / "corpus.jsonl")
    test, qrels = split_queries(ctx.data, "test")
    queries = list(test.values()) + haystack.queries(ctx.size(GENERATED_QUERIES, 50))
    analyzer = Analyzer()
    builders, ids, analyse_s = analysed_haystacks(haystack, sizes, analyzer)
    results = {}
    for size in sizes:
        started = time.perf_counter()
        postings, vocabulary = builders.pop(size).finish()
        index = BM25Index.from_postings(postings, vocabulary, analyzer, BM25Params())
        build_s = time.perf_counter() - started
        matrix = sum(np.asarray(index.engine.scores[k]).nbytes for k in ("data", "indices", "indptr"))
        held = sum(a.nbytes for a in (postings.indptr, postings.docs, postings.tfs, postings.lengths))
        del postings
        results[size] = {
            "build_s": round(build_s, 1),
            "score_matrix_bytes_per_doc": round(matrix / size, 1),
            "postings_bytes_per_doc": round(held / size, 1),
            **bm25_at_size(index, queries, test, qrels, ids, np.random.default_rng(size)),
        }
        del index
    return _tables(results, sizes, len(queries), analyse_s, haystack)


def _tables(results: dict, sizes: tuple[int, ...], queries: int, analyse_s: float, haystack: Haystack) -> list[Table]:
    latency_rows = []
    for key in results[sizes[0]]["latency"]:
        for name in ("exhaustive", "maxscore", "served"):
            p50s = [results[s]["latency"][key][name]["p50_ms"] for s in sizes]
            latency_rows.append(
                {
                    "search": f"{key}, {name}",
                    **{f"p50 ms at {s:,}": p for s, p in zip(sizes, p50s)},
                    f"p99 ms at {sizes[-1]:,}": results[sizes[-1]]["latency"][key][name]["p99_ms"],
                    "growth exponent": growth_exponent(list(sizes), p50s),
                }
            )
        ratio = [results[s]["latency"][key]["maxscore"]["p50_ms"] / results[s]["latency"][key]["exhaustive"]["p50_ms"] for s in sizes]
        latency_rows.append({"search": f"{key}, maxscore / exhaustive", **{f"p50 ms at {s:,}": round(r, 3) for s, r in zip(sizes, ratio)}})
    size_rows = [
        {
            "documents": f"{s:,}",
            "BM25 build s (from postings)": results[s]["build_s"],
            "score matrix bytes a document": results[s]["score_matrix_bytes_per_doc"],
            "postings bytes a document": results[s]["postings_bytes_per_doc"],
            "pruned rankings differing": f"{results[s]['differing_rankings']} of {results[s]['compared']}",
            "test nDCG@10": round(results[s]["quality"]["ndcg@10"], 4),
            "test Recall@100": round(results[s]["quality"]["recall@100"], 4),
        }
        for s in sizes
    ]
    note = (
        f"{queries} queries (the test split's and generated ones), one at a time on one thread, the scorers interleaved "
        f"query by query; the haystack's {haystack.vocabulary_size:,}-word vocabulary, analysis of all "
        f"{sizes[-1]:,} documents took {analyse_s:.0f} s."
    )
    return [
        Table("BM25 top-k: exhaustive vs MaxScore as the collection grows", latency_rows, note),
        Table("BM25 index and quality by size", size_rows),
    ]


VECTOR_KINDS = ("flat", "sq8", "hnsw_sq8")


def _compressed(ctx) -> list[Table]:
    import faiss

    index = open_index(ctx.untuned_index)
    test, qrels = split_queries(ctx.data, "test")
    queries = dict(list(test.items())[: ctx.size(len(test), 20)])
    vectors = index.query_embedder.encode(list(queries.values()))
    rows, flat_top10 = [], None
    for kind in VECTOR_KINDS:
        params = FaissParams(kind=kind)
        built = build_faiss_index(np.asarray(index.embeddings), params, "cpu")
        pipeline = dataclasses.replace(index, dense=DenseIndex(built, params, "cpu", index.embeddings)).pipeline()
        runs: dict[str, dict] = {"dense": {}, "hybrid": {}}
        top10 = []
        for (qid, text), vector in zip(queries.items(), vectors):
            for mode, run in runs.items():
                ranking = pipeline.search(text, 100, {"mode": mode}, vector=vector).ranking
                run[qid] = {index.doc_ids[i]: float(s) for i, s in zip(ranking.doc_idx.tolist(), ranking.scores.tolist())}
                if mode == "dense":
                    top10.append(set(ranking.doc_idx[:10].tolist()))
        flat_top10 = flat_top10 or top10
        quality = {mode: evaluate(run, {q: qrels[q] for q in queries}, ("ndcg@10", "recall@100")) for mode, run in runs.items()}
        rows.append(
            {
                "kind": kind,
                "factory": params.factory(index.num_docs),
                "bytes a vector in memory": round(len(faiss.serialize_index(built)) / index.num_docs, 1),
                "dense recall@10 vs flat": round(float(np.mean([len(a & b) / 10 for a, b in zip(top10, flat_top10)])), 4),
                **{f"{mode} {metric}": round(value, 4) for mode, q in quality.items() for metric, value in q.items()},
            }
        )
    note = f"{len(queries)} test queries, k=100; the compressed kinds rescore 4 candidates a result (pq_refine) from embeddings.npy."
    return [Table("The same vectors as flat and 8-bit indexes", rows, note)]


CASES = [
    Case(
        "A million documents",
        "BM25 at scale",
        "the dataset plus generated distractors at 100k, 300k and 1M documents: BM25 exhaustive vs MaxScore, quality by size",
        _bm25,
    ),
    Case(
        "A million documents",
        "Compressed vectors",
        "the untuned index's vectors as flat, sq8 and hnsw_sq8 indexes: memory a vector, recall against flat, quality",
        _compressed,
    ),
]
