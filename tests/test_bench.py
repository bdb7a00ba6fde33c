from evaluation.bench import ann_comparison, bm25_throughput, http_load
from indexer.store import open_index

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


def test_http_load_is_bounded_and_error_free(scifact_slice_index):
    report = http_load(scifact_slice_index, QUERIES, concurrency_levels=(1, 2), requests_per_level=6)
    assert set(report) == {"1 clients", "2 clients"}
    assert all(v["requests"] == 6 and v["errors"] == 0 for v in report.values())
