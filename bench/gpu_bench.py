"""The models on a GPU: passage embedding throughput (ONNX Runtime CUDA), one query's embedding on the GPU vs the CPU,
and reranking the hybrid top 50, each side by side in one run. (FAISS on the GPU: `accel_bench`.)"""

from __future__ import annotations

import statistics
from pathlib import Path

from bench.accel_bench import rerank_latency
from bench.harness import Case, Table, interleaved, percentiles, rate
from bench.machine import describe_machine
from hybrid_retrieval.common.errors import ConfigError
from hybrid_retrieval.indexer.store import MODEL_DIR, open_index
from hybrid_retrieval.models.embedder import OnnxEmbedder
from hybrid_retrieval.models.providers import on_gpu
from hybrid_retrieval.search.dense import gpu_count


def check_gpu() -> None:
    """A clear error, before anything is loaded, on a machine where neither ONNX Runtime nor FAISS can use a GPU."""
    machine = describe_machine()
    if "CUDAExecutionProvider" not in machine["onnx_providers"] or not gpu_count():
        raise ConfigError(
            f"the GPU case needs a CUDA GPU for ONNX Runtime and FAISS: ONNX Runtime offers "
            f"{machine['onnx_providers'] or 'nothing'}, FAISS sees {gpu_count()} GPU(s) (GPUs: "
            f"{', '.join(machine['gpus']) or 'none'}); install the gpu extra on a GPU machine"
        )


def run(
    index_dir: Path, queries: list[str], reranker: str | None, passages: int = 4096, batch_size: int = 256, n_queries: int = 200
) -> dict:
    check_gpu()
    index = open_index(index_dir, verify="size", device="gpu")
    if not on_gpu(index.embedder):
        raise ConfigError("ONNX Runtime did not place the model on the GPU (see the log for the provider error)")
    documents = [index.doc_text(i % index.num_docs) for i in range(passages)]
    index.embedder.encode(documents[:batch_size], batch_size=batch_size)  # warm-up: kernels, allocator
    rates = [rate(len(documents), lambda: index.embedder.encode(documents, batch_size=batch_size)) for _ in range(3)]
    cpu = OnnxEmbedder(index_dir / MODEL_DIR, device="cpu")
    times = interleaved({"gpu": lambda q: index.embedder.encode([q]), "cpu": lambda q: cpu.encode([q])}, queries[:n_queries])
    report = {
        "passage_embedding": {"passages_per_s": round(statistics.median(rates), 1), "passages": passages, "batch_size": batch_size},
        "query_embedding": {name: percentiles(values) for name, values in times.items()},
        "queries": len(times["gpu"]),
    }
    if reranker:
        report["rerank"] = rerank_latency(index, reranker, queries, device="gpu")
    index.close()
    return report


def _gpu(ctx) -> list[Table]:
    r = run(ctx.index, ctx.queries(), str(ctx.reranker), passages=ctx.size(4096, 512), n_queries=ctx.size(200, 20))
    passage = r["passage_embedding"]
    query = [{"device": name, **row} for name, row in r["query_embedding"].items()]
    tables = [
        Table(f"passage embedding, fp32, batches of {passage['batch_size']}, median of 3", [passage]),
        Table(f"one query's embedding ({r['queries']} queries, interleaved)", query),
    ]
    if "rerank" in r:
        rerank = r["rerank"]
        tables.append(
            Table(
                f"reranking the hybrid top {rerank['depth']} on the GPU ({rerank['queries']} queries)",
                [{"backend": name, **percentiles_of(rerank[name])} for name in ("torch", "onnx_fp32", "onnx_int8")],
            )
        )
    return tables


def percentiles_of(row: dict) -> dict:
    return {key: row[key] for key in ("p50_ms", "p95_ms", "p99_ms")}


CASES = [Case("Models", "GPU", "the index's model and the reranker on the GPU, beside the CPU", _gpu, needs=("gpu",))]
