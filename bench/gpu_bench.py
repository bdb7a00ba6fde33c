"""`hybrid bench --gpu`: every GPU row in one command, written into docs/BENCHMARKS.md.

Passage embedding throughput (ONNX Runtime CUDA), one query's embedding on the GPU vs the CPU, FAISS flat and IVF on
synthetic vectors on GPU vs CPU, and reranking the hybrid top 50 (with --reranker), each side by side in one run.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from bench.accel_bench import faiss_cpu_vs_gpu, rerank_latency
from bench.harness import interleaved
from bench.harness import percentiles
from bench.machine import describe_machine
from hybrid_retrieval.indexer.corpus import split_queries
from hybrid_retrieval.indexer.store import MODEL_DIR, open_index
from hybrid_retrieval.models.embedder import OnnxEmbedder
from hybrid_retrieval.models.providers import on_gpu
from hybrid_retrieval.search.dense import gpu_count
from hybrid_retrieval.search.errors import ConfigError

SECTION = "## GPU (`hybrid bench --gpu`)"
TARGETS = {"passages_per_s": 10_000, "faiss_flat_speedup": 10}  # the throughput issue's targets


def check_gpu() -> None:
    """A clear error, before anything is loaded, on a machine where neither ONNX Runtime nor FAISS can use a GPU."""
    machine = describe_machine()
    if "CUDAExecutionProvider" not in machine["onnx_providers"] or not gpu_count():
        raise ConfigError(f"`hybrid bench --gpu` needs a CUDA GPU for ONNX Runtime and FAISS: ONNX Runtime offers "
                          f"{machine['onnx_providers'] or 'nothing'}, FAISS sees {gpu_count()} GPU(s) (GPUs: "
                          f"{', '.join(machine['gpus']) or 'none'}); install the gpu extra on a GPU machine")


def run(index_dir: Path, dataset: Path, split: str = "test", reranker: str | None = None,
        faiss_vectors: int = 1_000_000, passages: int = 4096, batch_size: int = 256) -> dict:
    check_gpu()
    queries, _ = split_queries(dataset, split)
    texts = list(queries.values())
    index = open_index(index_dir, verify="size", device="gpu")
    if not on_gpu(index.embedder):
        raise ConfigError("ONNX Runtime did not place the model on the GPU (see the log for the provider error)")
    documents = [index.doc_text(i % index.num_docs) for i in range(passages)]
    index.embedder.encode(documents[:batch_size], batch_size=batch_size)  # warm-up: kernels, allocator
    rates = []
    for _ in range(3):
        start = time.perf_counter()
        index.embedder.encode(documents, batch_size=batch_size)
        rates.append(len(documents) / (time.perf_counter() - start))
    cpu = OnnxEmbedder(index_dir / MODEL_DIR, device="cpu")
    times = interleaved({"gpu": lambda q: index.embedder.encode([q]), "cpu": lambda q: cpu.encode([q])}, texts[:200])
    report = {"machine": describe_machine(), "index": str(index_dir),
              "passage_embedding": {"passages_per_s": round(statistics.median(rates), 1), "passages": passages,
                                    "batch_size": batch_size},
              "query_embedding": {name: percentiles(values) for name, values in times.items()},
              "faiss": faiss_cpu_vs_gpu(faiss_vectors)}
    if reranker:
        report["rerank"] = rerank_latency(index, reranker, texts, device="gpu")
    index.close()
    return report


def markdown(report: dict) -> str:
    machine, passage, query, faiss = report["machine"], report["passage_embedding"], report["query_embedding"], report["faiss"]
    met = lambda ok: "met" if ok else "not met"  # noqa: E731
    rate = passage["passages_per_s"]
    lines = [SECTION, "", f"On {', '.join(machine['gpus'])} ({machine['cpu_model']}, {machine['cpu_count']} CPU cores).", "",
             f"Passage embedding (ONNX Runtime CUDA, fp32, batches of {passage['batch_size']}, {passage['passages']} scifact "
             f"passages, median of 3): **{rate:,.0f} passages/s** (target {TARGETS['passages_per_s']:,}: {met(rate >= TARGETS['passages_per_s'])}).",
             "", f"One query's embedding: GPU p50 {query['gpu']['p50_ms']:.2f} ms, CPU p50 {query['cpu']['p50_ms']:.2f} ms "
             "(200 test queries, interleaved).", "",
             f"FAISS on {faiss['vectors']:,} clustered synthetic vectors of dimension {faiss['dimension']}, {faiss['queries']} "
             "queries batched:", "", "| index, device | queries/s | recall@10 vs flat | build s |", "|---|---:|---:|---:|"]
    for name, row in faiss["results"].items():
        lines.append(f"| {name} | {row['qps']:.0f} | {row['recall@10_vs_flat']:.4f} | {row['build_s']:.1f} |")
    flat = {name.rsplit(" ", 1)[1]: row["qps"] for name, row in faiss["results"].items() if name.startswith("Flat")}
    if "gpu" in flat:
        speedup = flat["gpu"] / flat["cpu"]
        lines += ["", f"Flat search GPU / CPU: {speedup:.1f}x (target {TARGETS['faiss_flat_speedup']}x: "
                  f"{met(speedup >= TARGETS['faiss_flat_speedup'])})."]
    rerank = report.get("rerank")
    if rerank:
        lines += ["", f"Reranking the hybrid top {rerank['depth']} on the GPU ({rerank['queries']} queries): " + ", ".join(
            f"{name} p50 {rerank[name]['p50_ms']:.0f} ms" for name in ("torch", "onnx_fp32", "onnx_int8")) + "."]
    return "\n".join(lines) + "\n"
