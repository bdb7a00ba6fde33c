import pytest

from bench.measure import ann_comparison, bm25_throughput, http_load
from hybrid_retrieval.indexer.store import open_index

QUERIES = ["cat on a mat", "stock markets fell", "pet dog care", "quantum qubits"]


def test_bm25_throughput_compares_both_engines(tiny_index):
    report = bm25_throughput(open_index(tiny_index), QUERIES, rounds=1)
    assert report["engine_qps"] > 0 and report["rank_bm25_qps"] > 0
    assert report["ratio"] == round(report["engine_qps"] / report["rank_bm25_qps"], 1)


def test_ann_comparison_measures_recall_against_flat(scifact_slice_index):
    report = ann_comparison(open_index(scifact_slice_index), QUERIES * 5)
    assert report["Flat"]["recall@10_vs_flat"] == 1.0
    assert set(report) == {"Flat", "IVF12,Flat", "HNSW32,Flat"}
    assert all(0 < v["recall@10_vs_flat"] <= 1 for v in report.values())


@pytest.mark.server
def test_http_load_is_bounded_and_error_free(scifact_slice_index):
    report = http_load(scifact_slice_index, QUERIES, concurrency_levels=(1, 2), requests_per_level=6)
    assert set(report) == {"1 clients", "2 clients"}
    assert all(v["requests"] == 6 and v["errors"] == 0 for v in report.values())


@pytest.mark.slow
def test_query_embedding_compares_onnx_and_torch(tiny_index):
    from bench.accel_bench import embedding_throughput, query_embedding_latency

    index = open_index(tiny_index)
    report = query_embedding_latency(index, QUERIES, n=4)
    assert report["queries"] == 4 and report["onnx"]["p50_ms"] > 0
    assert report["torch_over_onnx_p50"] == round(report["torch"]["p50_ms"] / report["onnx"]["p50_ms"], 2)
    assert embedding_throughput(index, n=6, batch_size=2)["passages"] == 6


def test_batching_tradeoff_reports_both_variants(tiny_index):
    from bench.accel_bench import batching_tradeoff

    report = batching_tradeoff(open_index(tiny_index), QUERIES, clients=(1, 4), seconds=0.3)
    assert set(report) == {"unbatched, 1 clients", "batched, 1 clients", "unbatched, 4 clients", "batched, 4 clients"}
    assert report["batched, 1 clients"]["mean_batch"] == 1.0  # a lone client never waits for company
    assert all(row["qps"] > 0 for row in report.values())


def test_faiss_cpu_vs_gpu_falls_back_to_cpu_and_measures_recall():
    from bench.accel_bench import faiss_cpu_vs_gpu
    from hybrid_retrieval.search.dense import gpu_count

    report = faiss_cpu_vs_gpu(num_vectors=4000, dimension=16, num_queries=50)
    assert report["results"]["Flat cpu"]["recall@10_vs_flat"] == 1.0
    assert 0 < report["results"]["IVF102,Flat cpu"]["recall@10_vs_flat"] <= 1.0
    assert ("Flat gpu" in report["results"]) == (gpu_count() > 0)
