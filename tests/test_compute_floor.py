import pytest

from bench.compute_floor import graph_flops, int8_peak_gops, peak, stage
from hybrid_retrieval.indexer.store import MODEL_DIR
from hybrid_retrieval.models.onnx_export import model_file


def test_flops_of_minilm_are_read_off_its_graph(tiny_index):
    flops = graph_flops(model_file(tiny_index / MODEL_DIR, "fp32"))
    hidden, ffn, layers = 384, 1536, 6  # all-MiniLM-L6-v2
    # per layer and token: Q, K, V and output projections (H x H each) and the feed-forward pair (H x F, F x H)
    assert flops.weight_flops_per_token == layers * 2 * (4 * hidden * hidden + 2 * hidden * ffn)
    assert (flops.attention_matmuls, flops.hidden) == (2 * layers, hidden)  # Q.K^T and softmax.V per layer
    assert flops.forward(22) == 22 * 21_233_664 + 12 * 2 * 22 * 22 * 384  # 0.47 GFLOP, as the issue says


def test_stage_fraction_is_floor_over_measured():
    row = stage(2e9, peak_gflops=100.0, measured_ms=40.0)  # 2 GFLOP at 100 GFLOP/s: 20 ms floor
    assert (row["floor_ms"], row["floor_per_s"], row["fraction"]) == (20.0, 50.0, 0.5)
    assert stage(2e9, 100.0, items_per_s=25.0)["fraction"] == 0.5
    peaks = {"fp32_gflops_1": 100.0, "fp32_gflops_2": 190.0, "int8_gops_1": 300.0}
    assert (peak(peaks, "int8", 1), peak(peaks, "int8", 2), peak(peaks, "fp32", 2)) == (300.0, 190.0, 190.0)


def test_int8_gemm_peak_is_measured():
    pytest.importorskip("onnx")
    assert int8_peak_gops(1, size=256, repeats=1) > 0
