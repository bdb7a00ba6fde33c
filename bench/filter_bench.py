"""Filters, highlights and batches, measured side by side on the dataset with synthetic metadata.

Builds (once) a flat index of the corpus with metadata derived from each document id (`synthetic_metadata`;
nothing is stored in the repository), then measures, in one run:
  - dense recall@10 against the exact filtered ranking, for flat, IVF and HNSW indexes over the same vectors, at
    filters admitting 100%, 10%, 1% and 0.1% of the documents: with the cost rule (brute force at most
    `flat_search_cutoff` documents) and with the FAISS selector forced (cutoff 0), which shows where it fails;
  - hybrid p50 latency unfiltered vs filtered at 10% and 0.1% (interleaved per query);
  - highlight cost per hit (lexical; and the semantic sentence for purely dense hits, per request);
  - one POST /search/batch of 32 searches vs 32 POST /search over loopback HTTP (throughput ratio).
"""

from __future__ import annotations

import itertools
import json
import statistics
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from bench.harness import Case, Table, verdict
from hybrid_retrieval.evaluation.server import running_server
from hybrid_retrieval.indexer.build import BuildOptions, build_index, index_is_current
from hybrid_retrieval.indexer.corpus import read_corpus
from hybrid_retrieval.indexer.store import OpenIndex, open_index
from hybrid_retrieval.search.dense import DenseIndex, FaissParams, build_faiss_index, exact_top_k

JOURNALS = ["Nature", "Cell", "Science", "Lancet", "BMJ", "JAMA", "PLoS One", "eLife", "NEJM", "PNAS"]
TAGS = ["oncology", "genetics", "immunology", "neuroscience"]
# filters on `bucket` (a hash of the id mod 1000) admitting about these shares of the documents
SELECTIVITIES = {"100%": 1000, "10%": 100, "1%": 10, "0.1%": 1}


def synthetic_metadata(doc_id: str) -> dict:
    """Deterministic metadata from a (numeric) document id: a multiplicative hash spreads consecutive ids."""
    h = (int(doc_id) * 2654435761) % 2**32
    year = 1990 + (h >> 10) % 30
    return {
        "bucket": h % 1000,
        "year": year,
        "journal": JOURNALS[(h >> 15) % 10],
        "tags": [tag for i, tag in enumerate(TAGS) if (h >> (20 + i)) & 1],
        "published": f"{year}-{1 + (h >> 5) % 12:02d}-{1 + (h >> 2) % 28:02d}",
        "open_access": bool((h >> 24) & 1),
    }


def selectivity_filter(name: str) -> dict:
    return {"bucket": {"lt": SELECTIVITIES[name]}}


def write_corpus(dataset: Path, out: Path, limit: int | None = None) -> Path:
    """The dataset's corpus with synthetic metadata, as JSONL (the first `limit` documents)."""
    with out.open("w") as fh:
        for doc in itertools.islice(read_corpus(dataset), limit):
            record = {"_id": doc.doc_id, "title": doc.title, "text": doc.text, "metadata": synthetic_metadata(doc.doc_id)}
            fh.write(json.dumps(record) + "\n")
    return out


def metadata_index(dataset: Path, workdir: Path) -> OpenIndex:
    workdir.mkdir(parents=True, exist_ok=True)
    corpus = write_corpus(dataset, workdir / "corpus.jsonl")
    if not index_is_current(corpus, workdir / "index"):
        build_index(corpus, workdir / "index", BuildOptions(progress=False))
    return open_index(workdir / "index", verify="size", device="cpu")


def filtered_recall(index: OpenIndex, query_vectors: np.ndarray, k: int = 10) -> dict:
    """Dense recall@k against the exact filtered top-k, per index kind, selectivity and search path."""
    vectors = np.asarray(index.embeddings)
    report = {}
    for params in (FaissParams(kind="flat"), FaissParams(kind="ivf"), FaissParams(kind="hnsw")):
        built = build_faiss_index(vectors, params, "cpu")
        rows = {}
        for name in SELECTIVITIES:
            allowed = index.metadata.allowed(selectivity_filter(name))
            row = {"documents": allowed.count}
            for label, cutoff in (("cost_rule", params.flat_search_cutoff), ("selector_forced", 0)):
                dense = DenseIndex(built, replace(params, flat_search_cutoff=cutoff), "cpu")
                recalls, latencies = [], []
                for vector in query_vectors:
                    exact = exact_top_k(lambda ids: vectors[ids] @ vector, allowed.ids, k).doc_idx  # noqa: B023
                    start = time.perf_counter()
                    if dense.brute_force(allowed):
                        found = exact_top_k(lambda ids: vectors[ids] @ vector, allowed.ids, k).doc_idx  # noqa: B023
                    else:
                        found = dense.search(vector, k, allowed).doc_idx
                    latencies.append((time.perf_counter() - start) * 1000)
                    recalls.append(len(set(found.tolist()) & set(exact.tolist())) / max(1, min(k, len(exact))))
                row[label] = {
                    "path": "brute force" if dense.brute_force(allowed) else "FAISS selector",
                    f"recall@{k}": round(float(np.mean(recalls)), 4),
                    "p50_ms": round(statistics.median(latencies), 3),
                }
            rows[name] = row
        report[params.factory(len(vectors))] = rows
    return report


def hybrid_latency(index: OpenIndex, queries: list[str], rounds: int = 2) -> dict:
    """Hybrid p50 per filter, the variants interleaved query by query so drift hits them alike."""
    pipeline = index.pipeline()
    variants = {"unfiltered": None, "10%": selectivity_filter("10%"), "0.1%": selectivity_filter("0.1%")}
    specs = {name: pipeline.resolve({"filter": f} if f else {}) for name, f in variants.items()}
    times: dict[str, list[float]] = {name: [] for name in variants}
    for query in queries[:20]:  # warm-up
        pipeline.search(query, 10, specs["unfiltered"])
    for _ in range(rounds):
        for query in queries:
            for name, spec in specs.items():
                times[name].append(pipeline.search(query, 10, spec).timings_ms["total"])
    p50 = {name: round(statistics.median(values), 3) for name, values in times.items()}
    return {
        "p50_ms": p50,
        "ratio_10%": round(p50["10%"] / p50["unfiltered"], 3),
        "ratio_0.1%": round(p50["0.1%"] / p50["unfiltered"], 3),
        "queries": len(queries),
        "rounds": rounds,
    }


def highlight_cost(index: OpenIndex, queries: list[str], k: int = 10) -> dict:
    """Milliseconds per hit of lexical highlighting; per request of the semantic sentence (purely dense hits: dense
    mode, where hits without a query term occur)."""
    pipeline, presenter = index.pipeline(), index.presenter()
    plain, lexical, semantic, dense_only = [], [], [], []
    for query in queries:
        results = {
            name: pipeline.search(query, k, {"mode": "dense", "highlight": h})
            for name, h in (("plain", False), ("lexical", True), ("semantic", {"semantic": True}))
        }
        for name, bucket in (("plain", plain), ("lexical", lexical), ("semantic", semantic)):
            start = time.perf_counter()
            hits = presenter.hits(results[name], query)
            bucket.append((time.perf_counter() - start) * 1000)
        dense_only.append(sum("semantic" in hit["highlight"] for hit in hits))
    per_hit = (statistics.median(lexical) - statistics.median(plain)) / k
    return {
        "hits_per_request": k,
        "plain_p50_ms": round(statistics.median(plain), 3),
        "highlight_p50_ms": round(statistics.median(lexical), 3),
        "per_hit_ms": round(per_hit, 4),
        "semantic_p50_ms": round(statistics.median(semantic), 3),
        "semantic_hits_per_request": round(float(np.mean(dense_only)), 2),
        "semantic_extra_per_dense_hit_ms": round((sum(semantic) - sum(lexical)) / max(1, sum(dense_only)), 3),
    }


def batch_vs_single(index_dir: Path, queries: list[str], size: int = 32, rounds: int = 5) -> dict:
    """One POST /search/batch of `size` searches vs `size` POST /search one after another, against `hybrid serve` on
    127.0.0.1 (loopback only), the two interleaved round by round."""
    import httpx

    groups = [queries[i : i + size] for i in range(0, len(queries) - size + 1, size)][:rounds]
    single_s, batch_s = [], []
    with running_server(index_dir, {"HYBRID_VERIFY": "size"}) as (url, _), httpx.Client(base_url=url, timeout=60) as client:
        client.post("/search", json={"query": "warm up"}).raise_for_status()
        for group in groups:
            start = time.perf_counter()
            for query in group:
                client.post("/search", json={"query": query}).raise_for_status()
            single_s.append(time.perf_counter() - start)
            start = time.perf_counter()
            client.post("/search/batch", json={"searches": [{"query": q} for q in group]}).raise_for_status()
            batch_s.append(time.perf_counter() - start)
    single, batch = statistics.median(single_s), statistics.median(batch_s)
    return {
        "searches": size,
        "rounds": len(groups),
        "singles_median_s": round(single, 4),
        "batch_median_s": round(batch, 4),
        "singles_qps": round(size / single, 1),
        "batch_qps": round(size / batch, 1),
        "throughput_ratio": round(single / batch, 2),
    }


def _filters(ctx) -> list[Table]:
    index = metadata_index(ctx.data, ctx.work / "metadata")
    queries = ctx.queries()[: ctx.size(10_000, 20)]
    vectors = index.query_embedder.encode(queries)
    admitted = [{"filter": name, "documents": index.metadata.allowed(selectivity_filter(name)).count} for name in SELECTIVITIES]
    recall = [
        {
            "index": factory,
            "filter": name,
            "documents": row["documents"],
            "cost rule: path": row["cost_rule"]["path"],
            "recall@10": row["cost_rule"]["recall@10"],
            "p50 ms": row["cost_rule"]["p50_ms"],
            "selector forced: recall@10": row["selector_forced"]["recall@10"],
            "selector forced: p50 ms": row["selector_forced"]["p50_ms"],
        }
        for factory, rows in filtered_recall(index, vectors).items()
        for name, row in rows.items()
    ]
    latency = hybrid_latency(index, queries, rounds=ctx.size(2, 1))
    hybrid = [
        {
            "filter": name,
            "p50 ms": p50,
            "ratio": round(p50 / latency["p50_ms"]["unfiltered"], 3),
            "verdict": verdict(p50 / latency["p50_ms"]["unfiltered"], higher_is_better=False),
        }
        for name, p50 in latency["p50_ms"].items()
    ]
    highlight = highlight_cost(index, queries)
    batch = batch_vs_single(index.path, queries, size=ctx.size(32, 8), rounds=ctx.size(5, 1))
    return [
        Table('filters `{"bucket": {"lt": N}}` on synthetic metadata', admitted),
        Table(
            "dense recall@10 against the exact filtered ranking",
            recall,
            "cost rule: what the service does (brute force over the admitted documents when a filter admits at most "
            "`flat_search_cutoff` of them); selector forced: the FAISS index searched with an `IDSelectorBitmap` "
            "whatever the selectivity.",
        ),
        Table(f"hybrid search p50 by filter ({latency['queries']} queries x {latency['rounds']} rounds, interleaved)", hybrid),
        Table(f"building {highlight['hits_per_request']} dense hits with and without highlights", [highlight]),
        Table(f"one POST /search/batch of {batch['searches']} searches vs {batch['searches']} POST /search, loopback", [batch]),
    ]


CASES = [
    Case(
        "Filters and highlights",
        "Filters, highlights, batches",
        "the corpus with synthetic metadata derived from each document id (its own flat index)",
        _filters,
    )
]
