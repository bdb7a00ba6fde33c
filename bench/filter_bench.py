"""Filters, highlights and batches, measured side by side on scifact with synthetic metadata.

    python -m bench.filter_bench DATA/scifact WORKDIR [--out filters.json] [--markdown]

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

import argparse
import itertools
import json
import statistics
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from hybrid_retrieval.evaluation.server import running_server
from hybrid_retrieval.indexer.build import BuildOptions, build_index, index_is_current
from hybrid_retrieval.indexer.corpus import read_corpus, split_queries
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
    return {"bucket": h % 1000, "year": year, "journal": JOURNALS[(h >> 15) % 10],
            "tags": [tag for i, tag in enumerate(TAGS) if (h >> (20 + i)) & 1],
            "published": f"{year}-{1 + (h >> 5) % 12:02d}-{1 + (h >> 2) % 28:02d}", "open_access": bool((h >> 24) & 1)}


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
                row[label] = {"path": "brute force" if dense.brute_force(allowed) else "FAISS selector",
                              f"recall@{k}": round(float(np.mean(recalls)), 4), "p50_ms": round(statistics.median(latencies), 3)}
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
    return {"p50_ms": p50, "ratio_10%": round(p50["10%"] / p50["unfiltered"], 3),
            "ratio_0.1%": round(p50["0.1%"] / p50["unfiltered"], 3), "queries": len(queries), "rounds": rounds}


def highlight_cost(index: OpenIndex, queries: list[str], k: int = 10) -> dict:
    """Milliseconds per hit of lexical highlighting; per request of the semantic sentence (purely dense hits: dense
    mode, where hits without a query term occur)."""
    pipeline, presenter = index.pipeline(), index.presenter()
    plain, lexical, semantic, dense_only = [], [], [], []
    for query in queries:
        results = {name: pipeline.search(query, k, {"mode": "dense", "highlight": h}) for name, h in
                   (("plain", False), ("lexical", True), ("semantic", {"semantic": True}))}
        for name, bucket in (("plain", plain), ("lexical", lexical), ("semantic", semantic)):
            start = time.perf_counter()
            hits = presenter.hits(results[name], query)
            bucket.append((time.perf_counter() - start) * 1000)
        dense_only.append(sum("semantic" in hit["highlight"] for hit in hits))
    per_hit = (statistics.median(lexical) - statistics.median(plain)) / k
    return {"hits_per_request": k, "plain_p50_ms": round(statistics.median(plain), 3),
            "highlight_p50_ms": round(statistics.median(lexical), 3), "per_hit_ms": round(per_hit, 4),
            "semantic_p50_ms": round(statistics.median(semantic), 3),
            "semantic_hits_per_request": round(float(np.mean(dense_only)), 2),
            "semantic_extra_per_dense_hit_ms": round((sum(semantic) - sum(lexical)) / max(1, sum(dense_only)), 3)}


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
    return {"searches": size, "rounds": len(groups), "singles_median_s": round(single, 4), "batch_median_s": round(batch, 4),
            "singles_qps": round(size / single, 1), "batch_qps": round(size / batch, 1), "throughput_ratio": round(single / batch, 2)}


def run(dataset: Path, workdir: Path, split: str = "test") -> dict:
    index = metadata_index(dataset, workdir)
    queries = list(split_queries(dataset, split)[0].values())
    query_vectors = index.query_embedder.encode(queries)
    return {"documents": index.num_docs, "queries": len(queries),
            "filter_documents": {name: index.metadata.allowed(selectivity_filter(name)).count for name in SELECTIVITIES},
            "filtered_recall": filtered_recall(index, query_vectors), "hybrid_latency": hybrid_latency(index, queries),
            "highlight": highlight_cost(index, queries), "batch": batch_vs_single(index.path, queries)}


def markdown(report: dict) -> str:
    """The BENCHMARKS.md section for a filter benchmark report (sentences drawn from the numbers)."""
    n = report["documents"]
    lines = ["## Filters, highlights, batches (`python -m bench.filter_bench`)", "",
             f"scifact ({n:,} documents, {report['queries']} test queries) with synthetic metadata derived from each "
             "document id. Filters `{\"bucket\": {\"lt\": N}}` admit "
             + ", ".join(f"{name} ({count:,} documents)" for name, count in report["filter_documents"].items()) + ".", "",
             "Dense recall@10 against the exact filtered ranking (brute force over the admitted documents). *cost rule*: "
             "what the service does (brute force when the filter admits at most `flat_search_cutoff` = 10,000 documents on IVF "
             "and HNSW, 1,000 on flat); "
             "*selector forced*: the FAISS index searched with an `IDSelectorBitmap` whatever the selectivity (IVF probes "
             "and HNSW `efSearch` grown by 1 / selectivity).", "",
             "| index | filter | documents | cost rule: path | recall@10 | p50 ms | selector forced: recall@10 | p50 ms |",
             "|---|---|---:|---|---:|---:|---:|---:|"]
    for factory, rows in report["filtered_recall"].items():
        for name, row in rows.items():
            rule, forced = row["cost_rule"], row["selector_forced"]
            lines.append(f"| {factory} | {name} | {row['documents']:,} | {rule['path']} | {rule['recall@10']:.4f} | "
                         f"{rule['p50_ms']:.3f} | {forced['recall@10']:.4f} | {forced['p50_ms']:.3f} |")
    worst = min((row["selector_forced"]["recall@10"], factory, name) for factory, rows in report["filtered_recall"].items()
                for name, row in rows.items())
    ruled = min(row["cost_rule"]["recall@10"] for rows in report["filtered_recall"].values() for row in rows.values())
    lines += ["", f"With the cost rule every filtered search here has recall@10 >= {ruled:.4f}; forcing the selector, the "
              f"worst is {worst[0]:.4f} ({worst[1]} at {worst[2]})."]
    lat = report["hybrid_latency"]
    p50 = lat["p50_ms"]
    lines += ["", f"Hybrid search (flat index, RRF, depth 100), p50 over {lat['queries']} queries x {lat['rounds']} rounds, "
              "interleaved: unfiltered "
              f"{p50['unfiltered']:.2f} ms, filter at 10% {p50['10%']:.2f} ms ({lat['ratio_10%']:.2f}x), at 0.1% "
              f"{p50['0.1%']:.2f} ms ({lat['ratio_0.1%']:.2f}x)."]
    h = report["highlight"]
    lines += ["", f"Highlighting {h['hits_per_request']} dense hits: building the hits takes {h['plain_p50_ms']:.2f} ms without "
              f"highlights and {h['highlight_p50_ms']:.2f} ms with them (p50), {h['per_hit_ms']:.3f} ms per hit. The semantic "
              f"sentence, for the {h['semantic_hits_per_request']:.1f} hits per request on average that no query term matches, "
              f"embeds their sentences in one model run: {h['semantic_p50_ms']:.2f} ms per request (p50), "
              f"{h['semantic_extra_per_dense_hit_ms']:.1f} ms more per such hit on average."]
    b = report["batch"]
    lines += ["", f"Batch: one `POST /search/batch` of {b['searches']} searches took {b['batch_median_s'] * 1000:.0f} ms, "
              f"{b['searches']} `POST /search` one after another {b['singles_median_s'] * 1000:.0f} ms (medians of "
              f"{b['rounds']} rounds, loopback HTTP, interleaved): {b['batch_qps']:.0f} vs {b['singles_qps']:.0f} searches/s, "
              f"{b['throughput_ratio']:.2f}x. The batch embeds its queries in one model run; on a CPU that costs about what "
              "one run per query costs (ONNX Runtime already spreads one query over the cores), so a batch saves the "
              "per-request HTTP overhead and little else. On a GPU one run for many queries is expected to pay (not measured "
              "here: this run had no GPU)."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dataset", type=Path)
    parser.add_argument("workdir", type=Path, help="where the metadata corpus and its index are built (reused when current)")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--markdown", action="store_true", help="print the BENCHMARKS.md section instead of the JSON")
    args = parser.parse_args()
    report = run(args.dataset, args.workdir)
    if args.out:
        args.out.write_text(json.dumps(report, indent=2))
    print(markdown(report) if args.markdown else json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
