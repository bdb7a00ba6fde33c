"""A million documents on one machine: how each cost grows with the collection.

The haystack (bench.haystack): the dataset's real documents plus reproducible distractors with its term statistics,
at 100k, 300k and 1M documents, so the test queries keep their judgments as the collection grows. Measured here, at
each size, side by side in one run:

  BM25: the index built from the analysed haystack (search.bm25, the bytes it holds a document); top-10 and top-100
  p50 of the exhaustive scorer (every posting of every query term summed) against block-max pruning (search.maxscore),
  interleaved query by query over the test queries and 1,000 generated ones, unfiltered and with a 1%-selective
  filter, and as served (search.bm25.worth_pruning picks one of the two); every pruned ranking checked identical to
  the exhaustive one (ids, scores, order); the test queries' nDCG@10 and Recall@100. Each cost's growth is the
  exponent of a power law fitted over the sizes. Then the dense and hybrid modes' quality at each size, with real
  embeddings (the dataset's documents by the default model, the distractors by the fast profile, cached in the work
  folder), over flat, sq8 and ivf_sq8 vector indexes (ivf_sq8: the default from 10,000 documents), each one's build
  time, dense-leg p50 and dense recall@10 against flat.

  API load: one service process and one client fill a collection with its own 64-number vectors (reproducible
  random unit vectors: what is measured is storage, not ranking), the haystack's text and the issue's metadata (`year`,
  and `tag` of 100 values: one `tag` is a 1%-selective filter), in bodies of 1,000 documents, to each size in turn.
  Between bodies one hybrid and one BM25 search run (what a search costs while the load and its background
  compactions run). At each size: the load rate of that stretch, the server's resident memory after it, a forced
  compaction's time and the memory after it, hybrid / BM25 / filtered p50 of the compacted collection, a single
  write's time to visible, the folder's bytes a document, then a restart: the time until the service is ready and its
  memory after searching.

  Compressed vectors: the dataset's untuned index searched with its vectors as flat, sq8, hnsw_sq8 and ivf_sq8 indexes
  (8-bit codes, candidates rescored from the stored vectors): bytes a vector in memory, the dense leg's recall@10
  against flat, and nDCG@10 / Recall@100 of the dense and hybrid modes.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import time
from pathlib import Path

import numpy as np

from bench.harness import Case, Table, interleaved, percentiles
from bench.haystack import EMBED_BATCH, Haystack, haystack_vectors
from hybrid_retrieval.indexer.corpus import split_queries
from hybrid_retrieval.indexer.store import open_index
from hybrid_retrieval.quality.metrics import evaluate
from hybrid_retrieval.search.analyzer import Analyzer
from hybrid_retrieval.search.bm25 import BM25Index, BM25Params
from hybrid_retrieval.search.dense import DenseIndex, FaissParams, build_faiss_index
from hybrid_retrieval.search.filters.language import Allowed
from hybrid_retrieval.search.fusion import Candidates, fuse
from hybrid_retrieval.search.postings import PostingsBuilder
from hybrid_retrieval.search.ranking import Ranking
from hybrid_retrieval.search.spec import SearchSpec

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
    index.leg(queries[0], 10, prune=True)  # the kernels compiled (or loaded from numba's cache) first
    started = time.perf_counter()
    for query in queries:  # each term's window bounds made once, as a service keeps them for the terms it is asked for
        index.leg(query, 10, prune=True)
    bounds_s = time.perf_counter() - started
    row: dict = {}
    differing = 0
    for depth in DEPTHS:
        for label, allowed in (("", None), (", 1% filter", selective)):
            exhaustive = lambda q, d=depth, a=allowed: index.ranking_from_scores(index.scores(q), d, a)
            pruned = lambda q, d=depth, a=allowed: index.leg(q, d, a, prune=True)[0]
            served = lambda q, d=depth, a=allowed: index.leg(q, d, a)[0]  # search.bm25.worth_pruning chooses
            times = interleaved({"exhaustive": exhaustive, "pruned": pruned, "served": served}, queries)
            differing += sum(not identical(exhaustive(q), pruned(q)) for q in queries)
            row[f"top-{depth}{label}"] = {name: percentiles(t) for name, t in times.items()}
    run = {}
    for qid, text in test.items():
        ranking = index.leg(text, 100, prune=True)[0]
        run[qid] = {ids[i]: float(s) for i, s in zip(ranking.doc_idx.tolist(), ranking.scores.tolist())}
    quality = evaluate(run, qrels, ("ndcg@10", "recall@100"))
    compared = len(queries) * len(DEPTHS) * 2
    return {"latency": row, "bounds_s": round(bounds_s, 1), "differing_rankings": differing, "compared": compared, "quality": quality}


VECTOR_KINDS_BY_SIZE = ("flat", "sq8", "ivf_sq8")  # no HNSW: a graph of 200,000 64-number vectors took 46 s here


def _haystack_vectors(ctx, haystack: Haystack, size: int, test_queries: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """The haystack's document vectors (the real documents' from the dataset's untuned index, the distractors' from
    the fast profile: the static model distilled from the same model and aligned on the dataset), cached in the work
    folder; and the test queries' vectors, embedded as the untuned index serves them."""
    from hybrid_retrieval.models.embedder import OnnxEmbedder

    untuned = open_index(ctx.untuned_index, verify="size")
    if untuned.doc_ids != [doc["_id"] for doc in haystack.real]:
        raise RuntimeError(f"{ctx.untuned_index} does not hold the dataset's documents in corpus order")
    fast = OnnxEmbedder(ctx.fast_index / "model")
    embed = lambda texts: fast.encode(texts, batch_size=EMBED_BATCH)
    vectors = haystack_vectors(haystack, size, np.asarray(untuned.embeddings), embed, ctx.work / "haystack" / f"vectors-{size}.npy")
    return vectors, untuned.query_embedder.encode(test_queries)


def quality_by_mode(
    bm25: BM25Index, vectors: np.ndarray, query_vectors: np.ndarray, test: dict[str, str], qrels: dict, ids: list[str]
) -> dict:
    """nDCG@10 / Recall@100 of the test queries in the dense and hybrid modes (the default spec's fusion, as an untuned
    index serves it) with each vector index kind of VECTOR_KINDS_BY_SIZE, and each kind's dense recall@10 against flat."""
    fusion, depth = SearchSpec().fusion, SearchSpec().depth
    lexical_legs = [bm25.leg(text, depth) for text in test.values()]  # the same for every vector kind
    out: dict = {}
    flat_top: dict[str, set] = {}  # the first kind's (flat's) dense top-10 of each query
    for kind in VECTOR_KINDS_BY_SIZE:
        params = FaissParams(kind=kind)
        started = time.perf_counter()
        dense = DenseIndex(build_faiss_index(vectors, params, "cpu"), params, "cpu", vectors)
        build_s = time.perf_counter() - started
        runs: dict[str, dict] = {"dense": {}, "hybrid": {}}
        overlap, took = [], []
        for qid, vector, (lexical, score_of) in zip(test, query_vectors, lexical_legs, strict=True):
            started = time.perf_counter()
            semantic = dense.search(vector, depth)
            took.append(time.perf_counter() - started)
            candidates = Candidates.from_rankings(
                {"bm25": lexical, "dense": semantic}, {"bm25": score_of, "dense": lambda idx, v=vector: vectors[idx] @ v}
            )
            for mode, ranking in (("dense", semantic), ("hybrid", fuse(candidates, fusion).ranking())):
                runs[mode][qid] = {ids[i]: float(score) for i, score in zip(ranking.doc_idx.tolist(), ranking.scores.tolist())}
            top = set(semantic.doc_idx[:10].tolist())
            flat_top.setdefault(qid, top)
            overlap.append(len(top & flat_top[qid]) / max(1, len(flat_top[qid])))
        out[kind] = {mode: evaluate(run, qrels, ("ndcg@10", "recall@100")) for mode, run in runs.items()}
        out[kind]["recall@10 vs flat"] = float(np.mean(overlap))
        out[kind]["build_s"], out[kind]["dense_p50_ms"] = build_s, float(np.median(took) * 1e3)
        del dense
    return out


def _bm25(ctx) -> list[Table]:
    sizes = QUICK_SIZES if ctx.quick else SIZES
    haystack = Haystack(ctx.data / "corpus.jsonl")
    test, qrels = split_queries(ctx.data, "test")
    queries = list(test.values()) + haystack.queries(ctx.size(GENERATED_QUERIES, 50))
    analyzer = Analyzer()
    vectors, query_vectors = _haystack_vectors(ctx, haystack, max(sizes), list(test.values()))
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
            "modes": quality_by_mode(index, np.asarray(vectors[:size]), query_vectors, test, qrels, ids),
        }
        del index
    return _tables(results, sizes, len(queries), analyse_s, haystack)


def _tables(results: dict, sizes: tuple[int, ...], queries: int, analyse_s: float, haystack: Haystack) -> list[Table]:
    latency_rows = []
    for key in results[sizes[0]]["latency"]:
        for name in ("exhaustive", "pruned", "served"):
            p50s = [results[s]["latency"][key][name]["p50_ms"] for s in sizes]
            latency_rows.append(
                {
                    "search": f"{key}, {name}",
                    **{f"p50 ms at {s:,}": p for s, p in zip(sizes, p50s)},
                    f"p99 ms at {sizes[-1]:,}": results[sizes[-1]]["latency"][key][name]["p99_ms"],
                    "growth exponent": growth_exponent(list(sizes), p50s),
                }
            )
        ratio = [results[s]["latency"][key]["pruned"]["p50_ms"] / results[s]["latency"][key]["exhaustive"]["p50_ms"] for s in sizes]
        latency_rows.append({"search": f"{key}, pruned / exhaustive", **{f"p50 ms at {s:,}": round(r, 3) for s, r in zip(sizes, ratio)}})
    size_rows = [
        {
            "documents": f"{s:,}",
            "BM25 build s (from postings)": results[s]["build_s"],
            "score matrix bytes a document": results[s]["score_matrix_bytes_per_doc"],
            "postings bytes a document": results[s]["postings_bytes_per_doc"],
            "window bounds of the queries' terms s": results[s]["bounds_s"],
            "pruned rankings differing": f"{results[s]['differing_rankings']} of {results[s]['compared']}",
            "test nDCG@10": round(results[s]["quality"]["ndcg@10"], 4),
            "test Recall@100": round(results[s]["quality"]["recall@100"], 4),
        }
        for s in sizes
    ]
    note = (
        f"{queries} queries (the test split's and generated ones), one at a time on one thread, the scorers interleaved "
        "query by query, each one first on a third of the queries; every query's terms searched once before (their "
        f"window bounds made, as a service keeps them); the haystack's {haystack.vocabulary_size:,}-word vocabulary, analysis of all "
        f"{sizes[-1]:,} documents took {analyse_s:.0f} s."
    )
    mode_rows = [
        {
            "documents": f"{s:,}",
            "vectors": kind,
            "index build s": round(results[s]["modes"][kind]["build_s"], 1),
            "dense leg p50 ms": round(results[s]["modes"][kind]["dense_p50_ms"], 2),
            "dense recall@10 vs flat": round(results[s]["modes"][kind]["recall@10 vs flat"], 4),
            **{
                f"{mode} {metric}": round(results[s]["modes"][kind][mode][metric], 4)
                for mode in ("dense", "hybrid")
                for metric in ("ndcg@10", "recall@100")
            },
        }
        for s in sizes
        for kind in VECTOR_KINDS_BY_SIZE
    ]
    mode_note = (
        "The test queries on the haystack: the real documents embedded with the default model, the distractors with the "
        "fast profile (its static model, aligned on the dataset), the queries as the untuned index embeds them; hybrid is "
        "the default spec's fusion of the BM25 and dense top-100, as an untuned index serves it. The dense leg's p50 is "
        "its top-100 on one thread; ivf_sq8 scans nprobe=64 of ~4*sqrt(n) clusters, sq8 every code, and both rescore 4 "
        "candidates a result from the stored vectors."
    )
    return [
        Table("BM25 top-k: exhaustive vs block-max pruning as the collection grows", latency_rows, note),
        Table("BM25 index and quality by size", size_rows),
        Table("Dense and hybrid quality by size", mode_rows, mode_note),
    ]


LOAD_BODY = 1_000
LOAD_DIMENSION = 64
LOAD_KEY = "million-bench"
LOAD_QUERIES = 200
LOAD_CLIENTS = 16
LOAD_SECONDS = 30


def _vectors(first: int, count: int) -> list[list[float]]:
    """Unit vectors of the documents at positions [first, first + count) (the same in every run)."""
    vectors = np.random.default_rng([7, first]).standard_normal((count, LOAD_DIMENSION))
    return (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).round(6).tolist()


def _memory_mib(pid: int) -> dict[str, float]:
    """The process's resident memory now, its peak since it started (VmHWM), and how much of it now are pages of mapped
    files (RssFile: index files read through mmap, which the kernel may drop and read again), MiB."""
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    keys = (("rss", "VmRSS"), ("peak", "VmHWM"), ("file", "RssFile"))
    return {name: round(int(status[key].split()[0]) / 1024, 1) for name, key in keys}


def _folder_bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


DISK_PARTS = {  # a collection folder's top-level names, by what they hold
    "documents": ("docs.jsonl", "docs.offsets.npy"),
    "BM25 score matrix": ("bm25",),
    "postings": ("postings",),
    "vector index": ("dense.faiss", "dense.trained.faiss"),  # the float32 vectors when it is flat, else 8-bit codes
    "stored vectors": ("embeddings.npy",),  # float32, beside an index of codes (which rescores from them)
    "metadata columns": ("metadata",),
    "write-ahead log": ("live",),
}


def _bytes_by_part(folder: Path) -> dict[str, int]:
    """The folder's bytes by DISK_PARTS (the rest: `other`)."""
    part_of = {name: part for part, names in DISK_PARTS.items() for name in names}
    out = dict.fromkeys([*DISK_PARTS, "other"], 0)
    for path in folder.rglob("*"):
        if path.is_file():
            out[part_of.get(path.relative_to(folder).parts[0], "other")] += path.stat().st_size
    return out


class _Loader:
    """One client of one collection in the service at `url`."""

    def __init__(self, url: str, name: str):
        import httpx

        self.client = httpx.Client(base_url=url, timeout=3600, headers={"X-API-Key": LOAD_KEY})
        self.name = name

    def load(self, documents: list[dict], first: int, queries: list[str]) -> tuple[float, dict[str, list[float]]]:
        """Seconds to write `documents` (positions first, ...) in bodies, and the searches' milliseconds between them."""
        during: dict[str, list[float]] = {"hybrid": [], "bm25": []}
        started, spent = time.perf_counter(), 0.0
        for at in range(0, len(documents), LOAD_BODY):
            body = documents[at : at + LOAD_BODY]
            for doc, vector in zip(body, _vectors(first + at, len(body))):
                doc["vector"] = vector
            self.client.put(f"/collections/{self.name}/documents", json={"documents": body}).raise_for_status()
            searched = time.perf_counter()
            query = queries[(at // LOAD_BODY) % len(queries)]
            during["hybrid"].append(self.search(query, {"mode": "hybrid"}, first + at))
            during["bm25"].append(self.search(query, {"mode": "bm25"}, first + at))
            spent += time.perf_counter() - searched
        return time.perf_counter() - started - spent, during

    def search(self, query: str, spec: dict, seed: int) -> float:
        started = time.perf_counter()
        self.client.post(
            f"/collections/{self.name}/search", json={"query": query, "vector": _vectors(seed, 1)[0], "k": 10, **spec}
        ).raise_for_status()
        return (time.perf_counter() - started) * 1000

    def throughput(self, url: str, queries: list[str], seconds: float) -> dict:
        """Hybrid searches from LOAD_CLIENTS connections at once, as fast as answered, for `seconds`."""
        from bench.loadgen import closed_loop

        bodies = [
            json.dumps({"query": query, "vector": _vectors(i, 1)[0], "k": 10, "mode": "hybrid"}).encode() for i, query in enumerate(queries)
        ]
        result = closed_loop(url, bodies, LOAD_CLIENTS, 10**9, seconds, f"/collections/{self.name}/search", {"X-API-Key": LOAD_KEY})
        if result["errors"]:
            raise RuntimeError(f"{result['errors']} of {result['requests']} searches from {LOAD_CLIENTS} clients failed")
        return result

    def searches(self, queries: list[str]) -> dict[str, dict[str, float]]:
        specs = {"hybrid": {"mode": "hybrid"}, "bm25": {"mode": "bm25"}, "hybrid, 1% filter": {"mode": "hybrid", "filter": {"tag": "t7"}}}
        calls = {name: (lambda i, spec=spec: self.search(queries[i], spec, i)) for name, spec in specs.items()}
        return {name: percentiles(times) for name, times in interleaved(calls, range(len(queries))).items()}

    def visible_ms(self, samples: int, seed: int) -> list[float]:
        """A single document's write until a search finds it, `samples` times, each written at a random point of the
        refresh interval (as independent writers are)."""
        out, pause = [], np.random.default_rng(seed)
        for i in range(samples):
            time.sleep(pause.uniform(0, 1.0))
            token = f"vis{seed}x{i}q"
            doc = {"id": f"visible-{seed}-{i}", "text": f"{token} probe", "vector": _vectors(2**40 + seed * 100 + i, 1)[0]}
            self.client.put(f"/collections/{self.name}/documents", json={"documents": [doc]}).raise_for_status()
            acked = time.perf_counter()
            # typo 0: the token must match exactly (the previous probe's token is one edit away)
            probe = {"query": token, "mode": "bm25", "k": 1, "typo": 0}
            while not self.client.post(f"/collections/{self.name}/search", json=probe).json()["hits"]:
                time.sleep(0.005)
            out.append((time.perf_counter() - acked) * 1000)
        return out

    def settled_memory(self, pid: int, timeout_s: float = 900) -> dict[str, float]:
        """The server's memory once the background compaction the load started (if any) has finished: its scratch
        folder is gone (`temporary_bytes`)."""
        deadline = time.perf_counter() + timeout_s
        while self.client.get(f"/collections/{self.name}/stats").json().get("temporary_bytes") and time.perf_counter() < deadline:
            time.sleep(0.5)
        return _memory_mib(pid)

    def compact_s(self) -> float:
        started = time.perf_counter()
        answer = self.client.post(f"/collections/{self.name}/compact")
        if answer.is_error:  # what the service said, not only its status
            raise RuntimeError(f"compaction: HTTP {answer.status_code}: {answer.text}")
        return time.perf_counter() - started

    def close(self) -> None:
        self.client.close()


def _api_load(ctx) -> list[Table]:
    import tempfile

    from hybrid_retrieval.evaluation.server import running_server

    sizes = QUICK_SIZES if ctx.quick else SIZES
    haystack = Haystack(ctx.data / "corpus.jsonl")
    queries = haystack.queries(ctx.size(LOAD_QUERIES, 20))
    rng = np.random.default_rng(0)
    results: dict[int, dict] = {}
    with tempfile.TemporaryDirectory(prefix="million-load-", dir=ctx.work) as tmp:
        data = Path(tmp) / "data"
        env = {"HYBRID_DATA": str(data), "HYBRID_WRITE_KEYS": LOAD_KEY}
        documents = haystack.documents(sizes[-1])
        loaded, name = 0, "haystack"
        server = running_server(None, env, log=ctx.work / "api-load-server.log")
        url, process = server.__enter__()
        try:
            client = _Loader(url, name)
            client.client.post(
                "/collections", json={"name": name, "settings": {"embedder": {"kind": "none", "dimension": LOAD_DIMENSION}}}
            ).raise_for_status()
            for size in sizes:
                batch = [
                    {
                        "id": d["_id"],
                        "title": d["title"],
                        "text": d["text"],
                        "metadata": {"year": int(rng.integers(1990, 2025)), "tag": f"t{int(rng.integers(100))}"},
                    }
                    for d in itertools.islice(documents, size - loaded)
                ]
                load_s, during = client.load(batch, loaded, queries)
                loaded = size
                row: dict = {"load_docs_per_s": round(len(batch) / load_s, 1), "during": {k: percentiles(v) for k, v in during.items()}}
                row["after_load"] = _memory_mib(process.pid)
                row["after_load_settled"] = client.settled_memory(process.pid)
                row["compaction_s"] = round(client.compact_s(), 1)
                manifest = json.loads((data / "collections" / name / "manifest.json").read_text())
                row["compaction_peak_mib"] = manifest["build"]["peak_rss_mib"]  # the build's process (a child above 20k)
                row["after_compaction"] = _memory_mib(process.pid)
                row["compacted"] = client.searches(queries)
                row["clients"] = client.throughput(url, queries, ctx.size(LOAD_SECONDS, 3))
                row["visible"] = percentiles(client.visible_ms(ctx.size(10, 3), size))
                loaded += ctx.size(10, 3)  # the probes are documents too
                row["disk_bytes_per_doc"] = round(_folder_bytes(data / "collections") / loaded, 1)
                row["disk_by_part"] = {part: round(n / loaded, 1) for part, n in _bytes_by_part(data / "collections" / name).items()}
                client.close()
                server.__exit__(None, None, None)
                started = time.perf_counter()
                server = running_server(None, env, log=ctx.work / "api-load-server.log")
                url, process = server.__enter__()
                row["restart_s"] = round(time.perf_counter() - started, 2)
                client = _Loader(url, name)
                client.searches(queries)
                row["after_restart"] = _memory_mib(process.pid)
                results[size] = row
            client.close()
        finally:
            server.__exit__(None, None, None)
    return _load_tables(results, sizes)


def _load_tables(results: dict, sizes: tuple[int, ...]) -> list[Table]:
    def by_size(label: str, value, exponent: bool = False) -> dict:
        values = [value(results[s]) for s in sizes]
        row = {"measurement": label, **{f"{s:,}": v for s, v in zip(sizes, values)}}
        if exponent:
            row["growth exponent"] = growth_exponent(list(sizes), values)
        return row

    rows = [
        by_size("API load, documents/s (that stretch)", lambda r: r["load_docs_per_s"], exponent=True),
        by_size("hybrid p50 ms while loading", lambda r: r["during"]["hybrid"]["p50_ms"]),
        by_size("BM25 p50 ms while loading", lambda r: r["during"]["bm25"]["p50_ms"]),
        by_size("hybrid p50 ms, compacted", lambda r: r["compacted"]["hybrid"]["p50_ms"], exponent=True),
        by_size("BM25 p50 ms, compacted", lambda r: r["compacted"]["bm25"]["p50_ms"], exponent=True),
        by_size(f"hybrid req/s, {LOAD_CLIENTS} clients, compacted", lambda r: r["clients"]["throughput_rps"], exponent=True),
        by_size(f"hybrid p50 ms, {LOAD_CLIENTS} clients", lambda r: r["clients"]["p50_ms"]),
        by_size("hybrid with a 1% filter p50 ms, compacted", lambda r: r["compacted"]["hybrid, 1% filter"]["p50_ms"], exponent=True),
        by_size(
            "hybrid p50 while loading / compacted", lambda r: round(r["during"]["hybrid"]["p50_ms"] / r["compacted"]["hybrid"]["p50_ms"], 2)
        ),
        by_size("memory after the load, MiB", lambda r: r["after_load"]["rss"]),
        by_size("memory after a compaction, MiB", lambda r: r["after_compaction"]["rss"]),
        by_size("memory after a restart and the searches, MiB", lambda r: r["after_restart"]["rss"], exponent=True),
        by_size("after the load / after a restart", lambda r: round(r["after_load"]["rss"] / r["after_restart"]["rss"], 2)),
        by_size("memory once the load's background compaction ended, MiB", lambda r: r.get("after_load_settled", {}).get("rss", "")),
        by_size(
            "that / after a restart",
            lambda r: round(r["after_load_settled"]["rss"] / r["after_restart"]["rss"], 2) if "after_load_settled" in r else "",
        ),
        by_size("of it mapped files' pages after the load, MiB", lambda r: r["after_load"].get("file", "")),
        by_size("of it mapped files' pages after a restart, MiB", lambda r: r["after_restart"].get("file", "")),
        by_size("peak memory since the last start, MiB", lambda r: r["after_compaction"]["peak"]),
        by_size("compaction s", lambda r: r["compaction_s"], exponent=True),
        by_size("compaction's build, peak memory MiB", lambda r: r.get("compaction_peak_mib", "")),
        by_size("write to visible p50 ms", lambda r: r["visible"]["p50_ms"]),
        by_size("restart until ready s", lambda r: r["restart_s"], exponent=True),
        by_size("disk bytes a document", lambda r: r["disk_bytes_per_doc"]),
        *(
            by_size(f"disk bytes a document: {part}", lambda r, p=part: r.get("disk_by_part", {}).get(p, ""))
            for part in [*DISK_PARTS, "other"]
        ),
    ]
    note = (
        f"One `hybrid serve` process (data directory, background compaction as configured by default) and one client "
        f"loading; bodies of {LOAD_BODY:,} documents with {LOAD_DIMENSION}-number vectors (the default vector index: "
        "flat, then ivf_sq8 from 10,000 documents); searches of generated queries, "
        f"each with a random vector, from one client (p50) or {LOAD_CLIENTS} at once for {LOAD_SECONDS} s (req/s); memory "
        "is the server's resident set (VmRSS, VmHWM for the peak; RssFile: its pages of mapped files)."
    )
    return [Table("A collection filled through the API, by size", rows, note)]


VECTOR_KINDS = ("flat", "sq8", "hnsw_sq8", "ivf_sq8")


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
        "the dataset plus generated distractors at 100k, 300k and 1M documents: BM25 exhaustive vs block-max pruning; BM25, dense and "
        "hybrid quality by size",
        _bm25,
    ),
    Case(
        "A million documents",
        "API load at scale",
        "one service filled through the API to 100k, 300k and 1M documents: load rate, memory, compaction, restart, disk by "
        "part, searches from 1 and 16 clients",
        _api_load,
    ),
    Case(
        "A million documents",
        "Compressed vectors",
        "the untuned index's vectors as flat, sq8, hnsw_sq8 and ivf_sq8 indexes: memory a vector, recall against flat, quality",
        _compressed,
    ),
]
