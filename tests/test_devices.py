"""Device selection: GPU paths fall back to CPU with a warning; on a GPU they agree with the CPU."""

import logging

import numpy as np
import pytest

from hybrid_retrieval.models.providers import onnx_providers
from hybrid_retrieval.search.dense import DenseIndex, FaissParams, build_faiss_index, gpu_count


def _cuda_in_onnxruntime() -> bool:
    import onnxruntime as ort

    return "CUDAExecutionProvider" in ort.get_available_providers()


RNG = np.random.default_rng(3)
DOCS = RNG.standard_normal((2000, 32)).astype(np.float32)
DOCS /= np.linalg.norm(DOCS, axis=1, keepdims=True)
QUERIES = DOCS[:20] + 0.05 * RNG.standard_normal((20, 32)).astype(np.float32)


@pytest.mark.skipif(_cuda_in_onnxruntime(), reason="this onnxruntime has CUDA")
def test_onnx_gpu_request_falls_back_to_cpu_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING):
        assert onnx_providers("gpu") == ["CPUExecutionProvider"]
    assert "GPU (CUDA) requested" in caplog.text
    assert onnx_providers("auto") == ["CPUExecutionProvider"]


@pytest.mark.skipif(gpu_count() > 0, reason="faiss sees a GPU")
@pytest.mark.parametrize("kind", ["flat", "ivf"])
def test_faiss_gpu_request_falls_back_to_cpu_with_a_warning(kind, caplog):
    params = FaissParams(kind=kind, nlist=16, nprobe=16)
    with caplog.at_level(logging.WARNING):
        dense = DenseIndex(build_faiss_index(DOCS, params, device="gpu"), params, device="gpu")
    assert not dense.on_gpu and "no GPU is visible to faiss" in caplog.text
    assert [r.doc_idx[0] for r in dense.search_batch(QUERIES, 5)] == list(range(20))


@pytest.mark.gpu
@pytest.mark.skipif(gpu_count() == 0, reason="needs a GPU visible to faiss")
@pytest.mark.parametrize("kind", ["flat", "ivf"])
def test_faiss_gpu_matches_cpu(kind):
    params = FaissParams(kind=kind, nlist=16, nprobe=16)
    built = build_faiss_index(DOCS, params, device="cpu")
    cpu, gpu = DenseIndex(built, params, device="cpu"), DenseIndex(built, params, device="gpu")
    assert gpu.on_gpu
    for c, g in zip(cpu.search_batch(QUERIES, 10), gpu.search_batch(QUERIES, 10), strict=True):
        np.testing.assert_allclose(g.scores, c.scores, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda_in_onnxruntime(), reason="needs onnxruntime with CUDA")
def test_onnx_cuda_embedder_matches_cpu():
    from hybrid_retrieval.models.embedder import OnnxEmbedder
    from hybrid_retrieval.models.onnx_export import export_onnx
    from hybrid_retrieval.models.registry import resolve_model

    folder = export_onnx(resolve_model())
    texts = ["vitamin D deficiency", "a longer sentence about protein folding in cells"]
    gpu = OnnxEmbedder(folder, device="gpu")
    assert gpu.providers[0] == "CUDAExecutionProvider"
    np.testing.assert_allclose(gpu.encode(texts), OnnxEmbedder(folder, device="cpu").encode(texts), atol=1e-3)
