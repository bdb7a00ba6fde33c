"""The models measured: reranking and query embedding by backend, micro-batching, FAISS by device; each comparison
side by side in one run."""

from __future__ import annotations

import statistics
import threading
import time

import numpy as np

from bench.compute_floor import embedding_floor, pairs_floor, peak
from bench.harness import Case, Table, interleaved, percentiles, rows_from
from hybrid_retrieval.indexer.store import OpenIndex, torch_embedder_for_index
from hybrid_retrieval.models.batching import BatchingEmbedder
from hybrid_retrieval.models.cross_encoder import load_cross_encoder
from hybrid_retrieval.models.onnx_export import training_record
from hybrid_retrieval.search.dense import DenseIndex, FaissParams, build_faiss_index, gpu_count
from hybrid_retrieval.search.rerank import DEFAULT_RERANK_DEPTH


def query_embedding_latency(index: OpenIndex, queries: list[str], n: int = 200) -> dict:
    """One query at a time, as served: the index's ONNX embedder vs sentence-transformers (torch)."""
    torch_embedder = torch_embedder_for_index(index.path, device="cpu")
    times = interleaved({"onnx": lambda q: index.embedder.encode([q]), "torch": lambda q: torch_embedder.encode([q])}, queries[:n])
    report = {name: percentiles(values) for name, values in times.items()}
    report["torch_over_onnx_p50"] = round(report["torch"]["p50_ms"] / report["onnx"]["p50_ms"], 2)
    report["queries"] = len(queries[:n])
    return report


def embedding_throughput(index: OpenIndex, n: int = 256, batch_size: int = 32) -> dict:
    """Passages per second through the index's embedder on its device (the indexing rate)."""
    texts = [index.doc_text(i) for i in range(min(n, index.num_docs))]
    index.embedder.encode(texts[:batch_size], batch_size=batch_size)
    start = time.perf_counter()
    index.embedder.encode(texts, batch_size=batch_size)
    seconds = time.perf_counter() - start
    return {
        "passages_per_s": round(len(texts) / seconds, 1),
        "passages": len(texts),
        "providers": getattr(index.embedder, "providers", None),
    }


def rerank_latency(
    index: OpenIndex,
    reranker: str,
    queries: list[str],
    depth: int = DEFAULT_RERANK_DEPTH,
    n: int = 20,
    device: str = "cpu",
    peaks: dict | None = None,
) -> dict:
    """Time to score the hybrid top-`depth` of a query: torch vs ONNX fp32 vs ONNX int8, same candidates; with `peaks`
    (compute_floor.machine_peaks), each ONNX model's fraction of the compute floor."""
    models = {
        "torch": load_cross_encoder(reranker, backend="torch", device=device),
        "onnx_fp32": load_cross_encoder(reranker, device=device),
        "onnx_int8": load_cross_encoder(reranker, device=device, precision="int8"),
    }
    pipeline = index.pipeline()
    inputs = [(q, [index.doc_text(int(d)) for d in pipeline.search(q, k=depth).ranking.doc_idx]) for q in queries[:n]]
    times = interleaved({name: (lambda x, m=m: m.score(*x)) for name, m in models.items()}, inputs)
    report = {
        name: {**percentiles(values), "pairs_per_s": round(depth * 1000 / statistics.median(values), 1)} for name, values in times.items()
    }
    report.update(depth=depth, queries=len(inputs), max_length=models["onnx_fp32"].max_length, providers=models["onnx_fp32"].providers)
    if peaks is not None:
        report["floor"] = {
            precision: pairs_floor(
                models[f"onnx_{precision}"],
                inputs,
                peak(peaks, precision, peaks["cores"]),
                report[f"onnx_{precision}"]["p50_ms"],
                peaks["cores"],
            )
            for precision in ("fp32", "int8")
        }
    return report


def _closed_loop(pipeline, queries: list[str], clients: int, seconds: float) -> dict:
    """`clients` threads searching back to back for `seconds`: latency percentiles and queries/s."""
    latencies, stop, lock = [], time.monotonic() + seconds, threading.Lock()

    def client(offset: int):
        i = offset
        while time.monotonic() < stop:
            start = time.perf_counter()
            pipeline.search(queries[i % len(queries)], k=10)
            with lock:
                latencies.append((time.perf_counter() - start) * 1000)
            i += clients

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {**percentiles(latencies), "qps": round(len(latencies) / (time.perf_counter() - started), 1)}


def batching_tradeoff(index: OpenIndex, queries: list[str], clients=(1, 4, 16), seconds: float = 10.0) -> dict:
    """Hybrid search from N threads for a fixed time, with and without coalescing query embeddings."""
    report = {}
    for n in clients:  # both variants at each load level, back to back
        report[f"unbatched, {n} clients"] = _closed_loop(index.pipeline(), queries, n, seconds)
        embedder = BatchingEmbedder(index.embedder)
        row = _closed_loop(index.pipeline(embedder=embedder), queries, n, seconds)
        row["mean_batch"] = round(embedder.batcher.items / max(embedder.batcher.batches, 1), 2)
        report[f"batched, {n} clients"] = row
    return report


def clustered_unit_vectors(num_vectors: int, dimension: int, num_queries: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Unit vectors around num_vectors / 500 centres, and queries near some of them: clustered, like real embeddings
    (uniform random vectors have no structure for IVF to exploit)."""
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((max(1, num_vectors // 500), dimension), dtype=np.float32)
    centers /= np.linalg.norm(centers, axis=1, keepdims=True)
    vectors = centers[rng.integers(0, len(centers), num_vectors)]
    vectors += rng.standard_normal(vectors.shape, dtype=np.float32) * np.float32(0.5 / np.sqrt(dimension))
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    queries = vectors[rng.choice(num_vectors, num_queries, replace=False)]
    queries = queries + rng.standard_normal(queries.shape, dtype=np.float32) * np.float32(0.1 / np.sqrt(dimension))
    return vectors, queries


def faiss_cpu_vs_gpu(num_vectors: int = 1_000_000, dimension: int = 384, num_queries: int = 1000, k: int = 10, seed: int = 0) -> dict:
    """Batched search throughput of flat and IVF indexes on CPU and, when faiss sees one, GPU (synthetic unit vectors)."""
    vectors, queries = clustered_unit_vectors(num_vectors, dimension, num_queries, seed)
    devices = ["cpu"] + (["gpu"] if gpu_count() else [])
    report = {"vectors": num_vectors, "dimension": dimension, "queries": num_queries, "gpus": gpu_count(), "results": {}}
    exact = None
    for params in (FaissParams(kind="flat"), FaissParams(kind="ivf", nlist=1024, nprobe=16)):
        cpu_qps = None
        for device in devices:
            start = time.perf_counter()
            built = build_faiss_index(vectors, params, device)
            build_s = time.perf_counter() - start
            dense = DenseIndex(built, params, device)
            dense.search_batch(queries[:10], k)  # warm-up (GPU: kernels, transfers)
            start = time.perf_counter()
            found = dense.search_batch(queries, k)
            qps = num_queries / (time.perf_counter() - start)
            exact = exact or found
            recall = float(np.mean([len(set(f.doc_idx.tolist()) & set(e.doc_idx.tolist())) / k for f, e in zip(found, exact, strict=True)]))
            report["results"][f"{params.factory(num_vectors)} {device}"] = {
                "qps": round(qps, 1),
                f"recall@{k}_vs_flat": round(recall, 4),
                "build_s": round(build_s, 1),
                "on_gpu": dense.on_gpu,
            }
            cpu_qps = cpu_qps or qps
        if len(devices) > 1:
            report["results"][f"{params.factory(num_vectors)} gpu_over_cpu"] = round(qps / cpu_qps, 1)
    return report


def _reranker(ctx) -> list[Table]:
    record = training_record(ctx.reranker)
    data, seconds, loss, options = record["data"], record["seconds"], record["loss"], record["options"]
    recipe = {
        "base model": record["base_model"]["name"],
        "train queries": data["queries"],
        "held-out queries": data.get("dev_queries", 0),
        "negatives": options["negatives"],
        "mined from top": options["mine_depth"],
        "epochs": options["epochs"],
        "steps": record["steps"],
        "pairs": data["pairs"],
        "max tokens": options["max_length"],
        "device": record["device"],
        "mining s": seconds["mining"],
        "training s": seconds["training"],
        "export s": seconds["export"],
        "loss first 10%": loss["first_10pct"],
        "loss last 10%": loss["last_10pct"],
        "chance loss": loss["chance"],
    }
    tables = [Table("training (`hybrid train-reranker`, from its training.json)", [recipe])]
    if record.get("interpolation"):
        dev = record["interpolation"]["dev"]
        tables.append(
            Table(
                f"interpolation weight on the {dev['queries']} held-out queries (chosen: {record['interpolation']['weight']:g})",
                [{"w": float(w), "nDCG@10": v} for w, v in dev["grid"].items()],
            )
        )
    latency = rerank_latency(ctx.opened, str(ctx.reranker), ctx.queries(), n=ctx.size(20, 3), device="cpu", peaks=ctx.peaks)
    rows = [
        {
            "backend": name,
            "p50 ms": latency[name]["p50_ms"],
            "p95 ms": latency[name]["p95_ms"],
            "pairs/s": latency[name]["pairs_per_s"],
            "fraction of the compute floor": latency.get("floor", {}).get(name.removeprefix("onnx_"), {}).get("fraction"),
        }
        for name in ("torch", "onnx_fp32", "onnx_int8")
    ]
    tables.append(
        Table(
            f"reranking the hybrid top {latency['depth']} ({latency['queries']} queries, interleaved, "
            f"{latency['max_length']} tokens a pair)",
            rows,
        )
    )
    return tables


def _query_embedding(ctx) -> list[Table]:
    index, queries = ctx.opened, ctx.queries()
    latency = query_embedding_latency(index, queries, n=ctx.size(200, 10))
    throughput = embedding_throughput(index, n=ctx.size(256, 32))
    floor = embedding_floor(
        index, queries, latency["onnx"]["p50_ms"], throughput["passages_per_s"], ctx.peaks, passages=throughput["passages"]
    )
    rows = [
        {"backend": "ONNX Runtime (served)", **_pick(latency["onnx"]), "ratio": 1.0},
        {"backend": "sentence-transformers (torch)", **_pick(latency["torch"]), "ratio": latency["torch_over_onnx_p50"]},
    ]
    floors = [
        {
            "stage": stage,
            "measured": row.get("measured_ms", row.get("measured_per_s")),
            "floor": row["floor_ms"] if "measured_ms" in row else row["floor_per_s"],
            "unit": "ms" if "measured_ms" in row else "items/s",
            "mean tokens": row["mean_tokens"],
            "fraction of peak": row["fraction"],
        }
        for stage, row in floor.items()
    ]
    return [
        Table(f"one query at a time ({latency['queries']} queries, interleaved; ratio: p50 over ONNX's)", rows),
        Table("passage embedding (indexing, batch 32)", [throughput]),
        Table("against the compute floor (FLOPs of the real token counts at the machine's GEMM peak, all cores)", floors),
    ]


def _pick(row: dict) -> dict:
    return {"p50 ms": row["p50_ms"], "p95 ms": row["p95_ms"]}


def _batching(ctx) -> list[Table]:
    report = batching_tradeoff(ctx.opened, ctx.queries(), seconds=ctx.size(10, 1))
    return [
        Table(
            "in-process hybrid search, k=10, closed loop",
            rows_from(report, "variant", {"qps": "queries/s", "p50_ms": "p50 ms", "p99_ms": "p99 ms", "mean_batch": "mean batch"}),
        )
    ]


def _faiss_devices(ctx) -> list[Table]:
    report = faiss_cpu_vs_gpu(ctx.size(1_000_000, 20_000), num_queries=ctx.size(1000, 100))
    rows = [
        {
            "index, device": name,
            "queries/s": v["qps"],
            "recall@10 vs flat": v["recall@10_vs_flat"],
            "build s": v["build_s"],
            "on GPU": v["on_gpu"],
        }
        for name, v in report["results"].items()
        if isinstance(v, dict)
    ]
    ratios = [
        {"index": name.removesuffix(" gpu_over_cpu"), "GPU over CPU, queries/s": v}
        for name, v in report["results"].items()
        if not isinstance(v, dict)
    ]
    return [
        Table(
            f"{report['vectors']:,} clustered synthetic unit vectors of dimension {report['dimension']}, "
            f"{report['queries']} queries batched",
            rows,
        )
    ] + ([Table("GPU / CPU", ratios)] if ratios else [])


CASES = [
    Case(
        "Models",
        "Reranker",
        "the cross-encoder `hybrid train-reranker` fine-tuned on the train split: its recipe, "
        "and the time to score a query's candidates with torch vs ONNX fp32 vs ONNX int8, same candidates",
        _reranker,
    ),
    Case(
        "Models",
        "Query embedding",
        "the index's ONNX model vs sentence-transformers on one query at a time; passage throughput; both against the compute floor",
        _query_embedding,
    ),
    Case(
        "Models",
        "Micro-batching",
        "hybrid search from N threads for a fixed time, with and without coalescing concurrent query embeddings into one model run",
        _batching,
    ),
    Case("Models", "FAISS on CPU and GPU", "flat and IVF indexes, batched search, CPU and (when FAISS sees one) GPU", _faiss_devices),
]
