"""How far each model stage is from what the machine can compute: FLOPs from the exported graph and the real token
counts, the machine's peak from GEMM micro-benchmarks run in the same process, and the achieved fraction.

The FLOPs of a transformer forward pass over n tokens, read off its ONNX graph: every MatMul by a weight matrix
(K x N) costs 2*K*N per token, and every MatMul of two activations (attention scores and their weighted sum) costs
2*n*n*H per sequence, H being the hidden size (the rows of the first weight). Layer norms, softmax and GELU are a few
percent and are left out, so the floor is a lower bound of the work.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class GraphFlops:
    weight_flops_per_token: int  # 2*K*N summed over the MatMuls by a weight
    attention_matmuls: int  # MatMuls of two activations: each 2*n*n*hidden per sequence
    hidden: int

    def forward(self, tokens: int) -> int:
        """FLOPs of one sequence of `tokens` tokens (no padding)."""
        return tokens * self.weight_flops_per_token + self.attention_matmuls * 2 * tokens * tokens * self.hidden


def graph_flops(onnx_path: Path | str) -> GraphFlops:
    """Count the MatMuls of an fp32 export (models.onnx_export): the int8 graph does the same arithmetic."""
    import onnx

    model = onnx.load(str(onnx_path), load_external_data=False)
    weights = {init.name: tuple(init.dims) for init in model.graph.initializer if len(init.dims) == 2}
    weight_flops, attention, hidden = 0, 0, None
    for node in model.graph.node:
        if node.op_type not in ("MatMul", "Gemm"):
            continue
        shape = weights.get(node.input[1])
        if shape is None:
            attention += node.input[0] not in weights
            continue
        k, n = shape if node.op_type == "MatMul" or not _transposed_b(node) else shape[::-1]
        weight_flops += 2 * k * n
        hidden = hidden or k
    if hidden is None:
        raise ValueError(f"{onnx_path}: no MatMul by a weight matrix: not a transformer export")
    return GraphFlops(weight_flops, attention, hidden)


def _transposed_b(node) -> bool:
    return any(a.name == "transB" and a.i for a in node.attribute)


def _best_seconds(run, repeats: int) -> float:
    run()  # warm-up: first touches, thread start
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def fp32_peak_gflops(threads: int, size: int = 1536, repeats: int = 5) -> float:
    """fp32 GEMM GFLOP/s of NumPy's BLAS on `threads` threads (size x size by size x size, best of `repeats`)."""
    from threadpoolctl import threadpool_limits

    rng = np.random.default_rng(0)
    a, b = rng.random((size, size), dtype=np.float32), rng.random((size, size), dtype=np.float32)
    with threadpool_limits(threads, user_api="blas"):
        seconds = _best_seconds(lambda: a @ b, repeats)
    return 2 * size**3 / seconds / 1e9


def int8_peak_gops(threads: int, size: int = 1536, repeats: int = 5) -> float:
    """u8 x s8 GEMM GOP/s of ONNX Runtime's MatMulInteger (the kernel of the int8 graphs) on `threads` threads."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.integers(-127, 128, (size, size), dtype=np.int8), "b")
    graph = helper.make_graph(
        [helper.make_node("MatMulInteger", ["a", "b"], ["y"])],
        "gemm",
        [helper.make_tensor_value_info("a", TensorProto.UINT8, [size, size])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [size, size])],
        [weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    a = rng.integers(0, 256, (size, size), dtype=np.uint8)
    seconds = _best_seconds(lambda: session.run(None, {"a": a}), repeats)
    return 2 * size**3 / seconds / 1e9


def machine_peaks() -> dict:
    """fp32 and int8 GEMM peaks on one core and on all of them, measured now."""
    cores = len(os.sched_getaffinity(0))
    peaks = {"cores": cores, "fp32_gflops_1": round(fp32_peak_gflops(1), 1), f"fp32_gflops_{cores}": round(fp32_peak_gflops(cores), 1)}
    with contextlib.suppress(ImportError):  # onnx is an indexing dependency: without it the int8 rows compare to the fp32 peak
        peaks |= {"int8_gops_1": round(int8_peak_gops(1), 1), f"int8_gops_{cores}": round(int8_peak_gops(cores), 1)}
    return peaks


def peak(peaks: dict, precision: str, threads: int) -> float:
    """GFLOP/s available to a stage at `precision` on `threads` cores (int8 falls back to the fp32 peak)."""
    key = f"int8_gops_{threads}" if precision == "int8" else f"fp32_gflops_{threads}"
    return peaks.get(key) or peaks[f"fp32_gflops_{threads}"]


def stage(
    flops_per_item: float, peak_gflops: float, measured_ms: float | None = None, items_per_s: float | None = None, threads: int = 1
) -> dict:
    """One stage against the floor: `measured_ms` per item on `threads` cores, or `items_per_s` across them."""
    floor_ms = flops_per_item / (peak_gflops * 1e9) * 1000
    row = {
        "gflop": round(flops_per_item / 1e9, 4),
        "peak_gflops": peak_gflops,
        "threads": threads,
        "floor_ms": round(floor_ms, 3),
        "floor_per_s": round(1000 / floor_ms, 1),
    }
    if measured_ms is not None:
        row |= {"measured_ms": round(measured_ms, 3), "fraction": round(floor_ms / measured_ms, 3)}
    if items_per_s is not None:
        row |= {"measured_per_s": round(items_per_s, 1), "fraction": round(items_per_s * floor_ms / 1000, 3)}
    return row


def texts_floor(flops: GraphFlops, embedder, texts: list[str], peak_gflops: float, threads: int, **measured) -> dict:
    """An embedder's work on `texts` (real token counts, no padding) against the floor; `measured`: `measured_ms` per
    text or `items_per_s`, as `stage` takes them."""
    lengths = [len(ids) for ids in embedder.token_ids(texts)]
    return {
        **stage(float(np.mean([flops.forward(n) for n in lengths])), peak_gflops, threads=threads, **measured),
        "mean_tokens": round(float(np.mean(lengths)), 1),
    }


def embedding_floor(index, queries: list[str], query_p50_ms: float, passages_per_s: float, peaks: dict, passages: int = 256) -> dict:
    """The index's fp32 model on all cores against the floor: one query at a time (p50), and passages in batches (the
    indexing rate, over the first `passages` documents as `accel_bench.embedding_throughput` embeds them)."""
    from hybrid_retrieval.indexer.store import MODEL_DIR
    from hybrid_retrieval.models.onnx_export import model_file

    flops = graph_flops(model_file(index.path / MODEL_DIR, "fp32"))
    cores = peaks["cores"]
    documents = [index.doc_text(i) for i in range(min(passages, index.num_docs))]
    return {
        "query": texts_floor(flops, index.embedder, queries, peak(peaks, "fp32", cores), cores, measured_ms=query_p50_ms),
        "passage": texts_floor(flops, index.embedder, documents, peak(peaks, "fp32", cores), cores, items_per_s=passages_per_s),
    }


def pairs_floor(model, inputs: list[tuple[str, list[str]]], peak_gflops: float, measured_ms: float, threads: int) -> dict:
    """Reranking a query's candidates (`inputs`: (query, texts) per query) with an ONNX cross-encoder against its floor."""
    from hybrid_retrieval.models.onnx_export import model_file

    flops = graph_flops(model_file(model.folder, "fp32"))
    work = float(np.mean([sum(flops.forward(n) for n in model.token_counts([(q, t) for t in texts])) for q, texts in inputs]))
    return stage(work, peak_gflops, measured_ms=measured_ms, threads=threads)
