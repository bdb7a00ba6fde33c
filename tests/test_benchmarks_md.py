"""docs/BENCHMARKS.md prose is drawn from the measured rows: each comparison says which side won, with the numbers."""

from __future__ import annotations

import json

import pytest

from bench import benchmarks_md as md
from bench.machine import describe_machine
from hybrid_retrieval.indexer.manifest import HubnessInfo, Manifest, read_manifest
from hybrid_retrieval.search.hubness import HubnessParams

VERSIONS = {"faiss": "1.0", "onnxruntime": "2.0", "bm25s": "3.0"}


def _latency_row(p50: float, bm25: float = 0.3) -> dict:
    return {"p50_ms": p50, "p95_ms": p50 * 1.5, "p99_ms": p50 * 2, "fusion_share": 0.05,
            "stage_p50_ms": {"bm25": bm25, "embed": p50 * 0.8, "total": p50}}


def _http_row(rps: float, p50: float, errors: int = 0) -> dict:
    return {"requests": 400, "errors": errors, "throughput_rps": rps, "p50_ms": p50, "p95_ms": p50 * 1.5, "p99_ms": p50 * 2}


def _batch_row(qps: float, p50: float, batched: bool) -> dict:
    return {"qps": qps, "p50_ms": p50, "p95_ms": p50 * 1.5, "p99_ms": p50 * 2, **({"mean_batch": 2.0} if batched else {})}


def _faiss(cpu_qps: float, gpu_qps: float | None) -> dict:
    results = {"Flat cpu": {"qps": cpu_qps, "recall@10_vs_flat": 1.0, "build_s": 1.0, "on_gpu": False}}
    if gpu_qps is not None:
        results["Flat gpu"] = {"qps": gpu_qps, "recall@10_vs_flat": 1.0, "build_s": 0.5, "on_gpu": True}
        results["Flat gpu_over_cpu"] = round(gpu_qps / cpu_qps, 1)
    return {"vectors": 1000, "dimension": 8, "queries": 10, "gpus": int(gpu_qps is not None), "results": results}


def _overhead(leg_ms: float, search_ms: float) -> dict:
    base_leg, base_search = 10.0, 1.0
    return {"none": {"dense_leg_p50_ms": base_leg, "leg_ratio": 1.0, "search_p50_ms": base_search, "search_ratio": 1.0},
            "qbnorm DIS": {"dense_leg_p50_ms": leg_ms, "leg_ratio": round(leg_ms / base_leg, 3),
                           "search_p50_ms": search_ms, "search_ratio": round(search_ms / base_search, 3)}}


# --- batching -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("unbatched", "batched", "verdict", "numbers", "absent", "tally"), [
    (100.0, 120.0, "raised throughput by 20%", "120.0 vs 100.0 queries/s", "lowered", "1 up, 0 down"),
    (120.0, 100.0, "lowered throughput by 17%", "100.0 vs 120.0 queries/s", "raised", "0 up, 1 down"),
])
def test_batching_sentence_says_which_side_won(unbatched, batched, verdict, numbers, absent, tally):
    sentence = md.batching_sentence({"unbatched, 4 clients": _batch_row(unbatched, 30.0, False),
                                     "batched, 4 clients": _batch_row(batched, 25.0, True)})
    assert verdict in sentence and numbers in sentence and tally in sentence and absent not in sentence


def test_batching_sentence_reports_noise_and_each_level():
    sentence = md.batching_sentence({"unbatched, 1 clients": _batch_row(100.0, 10.0, False),
                                     "batched, 1 clients": _batch_row(101.0, 10.0, True),
                                     "unbatched, 16 clients": _batch_row(100.0, 150.0, False),
                                     "batched, 16 clients": _batch_row(150.0, 100.0, True)})
    assert "at 1 client batching left throughput within noise at +1.0%" in sentence
    assert "at 16 clients batching raised throughput by 50%" in sentence
    assert "1 up, 0 down, 1 within noise" in sentence


# --- concurrent legs ------------------------------------------------------------------------------------------------


def test_parallel_legs_sentence_says_concurrent_legs_lowered_latency():
    sentence = md.parallel_legs_sentence({"hybrid rrf": _latency_row(10.0), "hybrid rrf, concurrent legs": _latency_row(8.0)})
    assert "for hybrid rrf they lowered p50 latency by 20%" in sentence
    assert "8.00 vs 10.00 ms" in sentence
    assert "raised" not in sentence


def test_parallel_legs_sentence_says_concurrent_legs_raised_latency():
    sentence = md.parallel_legs_sentence({"hybrid cc": _latency_row(8.0), "hybrid cc, concurrent legs": _latency_row(10.0)})
    assert "for hybrid cc they raised p50 latency by 25%" in sentence
    assert "10.00 vs 8.00 ms" in sentence
    assert "lowered" not in sentence


def test_parallel_legs_sentence_within_noise_and_absent():
    sentence = md.parallel_legs_sentence({"hybrid cc": _latency_row(10.0), "hybrid cc, concurrent legs": _latency_row(10.1)})
    assert "they left p50 latency within noise at +1.0% (10.10 vs 10.00 ms" in sentence
    assert md.parallel_legs_sentence({"bm25": _latency_row(0.2)}) == ""


# --- HTTP scaling ---------------------------------------------------------------------------------------------------


def test_http_scaling_sentence_when_throughput_scales():
    sentence = md.http_scaling_sentence({"1 clients": _http_row(50.0, 20.0), "16 clients": _http_row(400.0, 40.0)})
    assert "From 1 to 16 concurrent clients" in sentence
    assert "throughput rose by 700%" in sentence
    assert "50.0 -> 400.0 req/s, 8.00x" in sentence
    assert "Peak throughput: 400.0 req/s at 16 clients" in sentence
    assert "CPU-bound" not in sentence and "rather than throughput" not in sentence


def test_http_scaling_sentence_when_throughput_falls():
    sentence = md.http_scaling_sentence({"16 clients": _http_row(40.0, 400.0, errors=3), "1 clients": _http_row(50.0, 20.0),
                                         "4 clients": _http_row(60.0, 66.0)})
    assert "throughput fell by 20%" in sentence
    assert "50.0 -> 40.0 req/s" in sentence
    assert "from 20.0 to 400.0 ms (20.0x)" in sentence
    assert "Peak throughput: 60.0 req/s at 4 clients" in sentence
    assert "3 at 16 clients" in sentence


def test_http_scaling_sentence_needs_two_levels():
    assert md.http_scaling_sentence({"1 clients": _http_row(50.0, 20.0)}) == ""


# --- FAISS GPU vs CPU -----------------------------------------------------------------------------------------------


def test_faiss_device_sentence_gpu_faster():
    sentence = md.faiss_device_sentence(_faiss(100.0, 1500.0))
    assert "for Flat the GPU was faster: 15.00x" in sentence
    assert "(1500 vs 100)" in sentence
    assert "No GPU" not in sentence


def test_faiss_device_sentence_gpu_slower():
    sentence = md.faiss_device_sentence(_faiss(1500.0, 100.0))
    assert "for Flat the GPU was slower: 0.07x" in sentence
    assert "(100 vs 1500)" in sentence
    assert "faster" not in sentence


def test_faiss_device_sentence_without_gpu():
    sentence = md.faiss_device_sentence(_faiss(100.0, None))
    assert "No GPU was visible to FAISS" in sentence


# --- hubness overhead -----------------------------------------------------------------------------------------------


def test_hubness_overhead_sentence_correction_slower():
    sentence = md.hubness_overhead_sentence(_overhead(leg_ms=12.0, search_ms=2.0))
    assert "qbnorm DIS slower by 20% (12.00 vs 10.00 ms)" in sentence
    assert "qbnorm DIS slower by 100% (2.000 vs 1.000 ms)" in sentence
    assert "costliest on the dense leg was qbnorm DIS, +20.0%" in sentence


def test_hubness_overhead_sentence_correction_not_slower():
    sentence = md.hubness_overhead_sentence(_overhead(leg_ms=8.0, search_ms=1.01))
    assert "qbnorm DIS faster by 20% (8.00 vs 10.00 ms)" in sentence
    assert "qbnorm DIS within noise at +1.0% (1.010 vs 1.000 ms)" in sentence
    assert "slower" not in sentence and "costliest" not in sentence


# --- machine line ---------------------------------------------------------------------------------------------------


def test_machine_line_names_the_gpu_seen():
    bench = {"cpu_count": 16, "machine": {"cpu_model": "Test CPU", "cpu_count": 16, "gpus": ["NVIDIA H100 80GB HBM3"],
                                          "faiss_gpus": 1, "onnx_providers": ["CUDAExecutionProvider", "CPUExecutionProvider"],
                                          "python": "3.11.9"}}
    line = md.machine_line(bench, VERSIONS)
    assert line.startswith("Machine: 16 cores, Test CPU, GPU NVIDIA H100 80GB HBM3")
    assert "FAISS saw 1" in line and "CUDAExecutionProvider" in line
    assert "Python 3.11.9" in line and "faiss 1.0, onnxruntime 2.0, bm25s 3.0" in line
    assert "no GPU" not in line


def test_machine_line_counts_identical_gpus():
    bench = {"machine": {"cpu_model": "Test CPU", "cpu_count": 8, "gpus": ["A100", "A100"], "faiss_gpus": 2}}
    assert "GPU 2x A100 (FAISS saw 2)" in md.machine_line(bench, VERSIONS)


def test_machine_line_says_no_gpu_seen_when_none_was():
    bench = {"cpu_count": 2, "machine": {"cpu_model": "Test CPU", "cpu_count": 2, "gpus": [], "faiss_gpus": 0,
                                         "onnx_providers": ["CPUExecutionProvider"], "python": "3.11.7"}}
    line = md.machine_line(bench, VERSIONS)
    assert line.startswith("Machine: 2 cores, Test CPU, no GPU seen;")


def test_machine_line_without_a_record_claims_nothing_about_the_gpu():
    line = md.machine_line({"cpu_count": 4}, VERSIONS)
    assert line.startswith("Machine: 4 cores, ")
    assert "GPU not recorded" in line
    assert "no GPU" not in line


def test_describe_machine_shape():
    machine = describe_machine()
    assert set(machine) == {"cpu_model", "cpu_count", "gpus", "faiss_gpus", "onnx_providers", "python"}
    assert isinstance(machine["gpus"], list) and isinstance(machine["faiss_gpus"], int)
    assert isinstance(machine["onnx_providers"], list) and machine["cpu_model"]


def test_gpu_names_tolerates_missing_nvidia_smi(monkeypatch):
    from bench import machine

    def missing(*args, **kwargs):
        raise FileNotFoundError("nvidia-smi")

    monkeypatch.setattr(machine.subprocess, "run", missing)
    assert machine.gpu_names() == []


# --- end to end -----------------------------------------------------------------------------------------------------


def _manifest(tiny_index) -> Manifest:
    manifest = read_manifest(tiny_index)
    manifest.build = {"documents_s": 1.0, "bm25_s": 1.0, "embeddings_s": 2.0, "faiss_s": 6.0, "total_s": 10.0, "peak_rss_mib": 100.0}
    manifest.versions, manifest.counts = VERSIONS, {"documents": 100, "bm25_vocabulary": 1000}
    manifest.hubness = HubnessInfo(folder="hubness-1", params=HubnessParams(beta=1.0), bank={"kind": "queries", "size": 50, "split": "train.tsv"},
                                   gallery={"size": 100}, activation={}, fit_seconds=1.0)
    return manifest


def _eval_report() -> dict:
    metrics = {"ndcg@10": 0.7, "recall@100": 0.9, "mrr@10": 0.6, "map@100": 0.6, "n10_skewness": 1.5,
               "wins": 0, "ties": 10, "losses": 0, "p_value_vs_baseline": 1.0}
    return {"dataset": "tiny", "split": "test", "queries": 10, "baseline": "bm25", "pipelines": {"bm25": metrics}}


def _bench(**extra) -> dict:
    """Every comparison the opposite of what the old hard-coded prose claimed."""
    return {"cpu_count": 2, "queries": 10,
            "bm25_throughput": {"engine_qps": 1000.0, "rank_bm25_qps": 10.0, "ratio": 100.0},
            "latency": {"bm25": _latency_row(0.2), "hybrid rrf": _latency_row(10.0),
                        "hybrid rrf, concurrent legs": _latency_row(7.0)},
            "dense_indexes": {"Flat": {"qps": 1000.0, "recall@10_vs_flat": 1.0, "build_s": 0.01}},
            "http": {"1 clients": _http_row(50.0, 20.0), "4 clients": _http_row(190.0, 21.0),
                     "16 clients": _http_row(760.0, 21.0)},
            "hubness_overhead": _overhead(leg_ms=9.9, search_ms=0.99),
            "batching": {"unbatched, 4 clients": _batch_row(100.0, 40.0, False),
                         "batched, 4 clients": _batch_row(130.0, 30.0, True)},
            "faiss_cpu_vs_gpu": _faiss(100.0, 2000.0), **extra}


@pytest.fixture
def manifest(tiny_index):
    return _manifest(tiny_index)


HARD_CODED = ["no GPU;", "no GPU,", "serialising the runs costs more than batching saves", "On a 2-core CPU",
              "already uses both cores", "Query embedding is CPU-bound", "queueing latency rather than throughput",
              "No GPU was visible to FAISS", "embedding dominates", "Inverted softmax costs one search"]


def test_render_draws_conclusions_from_the_rows(manifest):
    machine = {"cpu_model": "Test CPU", "cpu_count": 2, "gpus": ["NVIDIA H100 80GB HBM3"], "faiss_gpus": 1,
               "onnx_providers": ["CUDAExecutionProvider"], "python": "3.12.0"}
    doc = md.render(manifest, _eval_report(), _bench(machine=machine))
    for phrase in HARD_CODED:
        assert phrase not in doc, phrase
    assert "Machine: 2 cores, Test CPU, GPU NVIDIA H100 80GB HBM3" in doc
    assert "the faiss stage took 60% of the build time" in doc
    assert "for hybrid rrf they lowered p50 latency by 30% (7.00 vs 10.00 ms" in doc
    assert "throughput rose by 1420% (50.0 -> 760.0 req/s, 15.20x)" in doc
    assert "at 4 clients batching raised throughput by 30% (130.0 vs 100.0 queries/s" in doc
    assert "for Flat the GPU was faster: 20.00x" in doc
    assert "qbnorm DIS within noise at -1.0% (9.90 vs 10.00 ms)" in doc
    # The structure and tables are unchanged.
    for heading in ("# Benchmarks", "## Quality: tiny test (10 queries)", "## Index build", "## BM25 engine vs rank-bm25",
                    "## In-process query latency", "## Dense index types", "## HTTP end to end", "## Hubness correction",
                    "## Micro-batching of concurrent queries", "## FAISS search", "## Reproduce"):
        assert heading in doc, heading
    assert "| batched, 4 clients | 130.0 | 30.0 | 60.0 | 2.0 |" in doc
    assert "| 16 | 400 | 0 | 760.0 | 21.0 | 31.5 | 42.0 |" in doc


def test_render_old_json_without_machine_claims_no_gpu_absence(manifest):
    doc = md.render(manifest, _eval_report(), _bench(faiss_cpu_vs_gpu=_faiss(100.0, None)))
    machine = next(line for line in doc.splitlines() if line.startswith("Machine:"))
    assert "GPU not recorded" in machine and "no GPU" not in machine
    assert "No GPU was visible to FAISS" in doc  # measured by the FAISS benchmark itself, so stated


def test_fusion_and_hubness_sentences_follow_the_recorded_decisions(manifest):
    assert "`rrf:60` (not tuned)" in md.fusion_sentence(manifest)
    manifest.evidence["fusion"] = {"metric": "ndcg@10", "queries": 809, "split": "qrels/train.tsv", "folds": 5,
                                   "values": {"untuned rrf:60": 0.7169, "tuned, cross-validated": 0.7160}, "decision": "kept untuned"}
    sentence = md.fusion_sentence(manifest)
    assert "`hybrid tune` on 809 queries of `train.tsv` kept untuned" in sentence and "tuned, cross-validated 0.7160" in sentence
    assert "uncorrected" in md.hubness_default_sentence(manifest)
    manifest.defaults = manifest.defaults.merge({"hubness": {"method": "qbnorm", "dynamic": True}})
    manifest.evidence["hubness"] = {"metric": "ndcg@10", "values": {"none": 0.66, "qbnorm DIS": 0.67}, "decision": "enabled"}
    assert md.hubness_default_sentence(manifest) == ("The index's default is qbnorm DIS (enabled; dense ndcg@10 on held-out bank "
                                                     "queries: none 0.6600, qbnorm DIS 0.6700).")


def test_filter_section_states_the_measured_numbers():
    from bench.filter_bench import markdown

    path = {"path": "brute force", "recall@10": 1.0, "p50_ms": 0.05}
    report = {"documents": 5183, "queries": 300, "filter_documents": {"100%": 5183, "10%": 514},
              "filtered_recall": {"HNSW32,Flat": {"10%": {"documents": 514, "cost_rule": path,
                                                          "selector_forced": {**path, "recall@10": 0.8, "path": "FAISS selector"}}}},
              "hybrid_latency": {"p50_ms": {"unfiltered": 5.0, "10%": 5.5, "0.1%": 4.0}, "ratio_10%": 1.1, "ratio_0.1%": 0.8,
                                 "queries": 300, "rounds": 2},
              "highlight": {"hits_per_request": 10, "plain_p50_ms": 0.5, "highlight_p50_ms": 4.0, "per_hit_ms": 0.35,
                            "semantic_p50_ms": 4.1, "semantic_hits_per_request": 0.7, "semantic_extra_per_dense_hit_ms": 93.0},
              "batch": {"searches": 32, "rounds": 5, "singles_median_s": 0.33, "batch_median_s": 0.24, "singles_qps": 97.0,
                        "batch_qps": 134.0, "throughput_ratio": 1.38}}
    text = markdown(report)
    assert "| HNSW32,Flat | 10% | 514 | brute force | 1.0000 | 0.050 | 0.8000 | 0.050 |" in text
    assert "the worst is 0.8000 (HNSW32,Flat at 10%)" in text
    assert "filter at 10% 5.50 ms (1.10x), at 0.1% 4.00 ms (0.80x)" in text and "1.38x" in text


def test_live_section_states_the_measured_numbers():
    from bench.live_bench import markdown

    phase = {"searches": 100, "errors": 0, "written_documents": 0, "lost": 0, "search_p50_ms": 100.0, "search_p99_ms": 200.0}
    load = {"seconds": 60.0, "searchers": 16, "writers": 2, "idle": phase,
            "with_writes": {**phase, "written_documents": 400, "search_p50_ms": 120.0}, "p50_ratio": 1.2}
    report = {"base_documents": 4664, "written": 519, "offline_embedding_docs_per_s": 20.0, "ingest_ratio": 0.9,
              "ingest": {"documents": 519, "batch": 64, "seconds": 28.8, "docs_per_s": 18.0},
              "visibility": {"samples": 30, "p50_ms": 540.0, "p99_ms": 1050.0},
              "search": {"p50_ms": {"live bm25": 0.4, "compacted bm25": 0.3, "live hybrid": 6.5, "compacted hybrid": 6.2,
                                    "live hybrid_dbnorm": 7.5, "compacted hybrid_dbnorm": 7.0},
                         "bm25_ratio": 1.33, "hybrid_ratio": 1.05, "hybrid_dbnorm_ratio": 1.07, "compaction_s": 2.9,
                         "live_documents": 549, "documents": 5213},
              "mixed_load": load, "mixed_load_all_cores": {**load, "p50_ratio": 1.4}}
    text = markdown(report)
    assert "| ingest / offline | 0.90x |" in text and "| 540 / 1050 ms |" in text
    assert "0.400 vs 0.300 ms (1.33x)" in text and "7.50 vs 7.00 ms (1.07x)" in text
    assert "(1.20x)" in text and "(1.40x)" in text and "400 documents written, 0 lost" in text


def test_query_section_states_the_measured_numbers():
    from bench.query_bench import markdown

    report = {"split": "test", "queries": 300, "cosine_fp32_int8": {"min": 0.9862, "median": 0.993},
              "ndcg@10": {"dense": {"fp32": 0.6451, "int8": 0.648}, "hybrid RRF": {"fp32": 0.7171, "int8": 0.7153}},
              "embed_p50_ms": {"fp32": 6.0, "int8": 3.0, "cache hit": 0.2}}
    text = markdown(report)
    assert "| nDCG@10, dense | 0.6451 | 0.6480 | +0.0029 |" in text and "| nDCG@10, hybrid RRF | 0.7171 | 0.7153 | -0.0018 |" in text
    assert "| embedding p50 | 6.00 ms | 3.00 ms | 0.50x |" in text and "0.200 ms p50, 30x faster" in text and "min 0.9862" in text


def _load(rps: float, p50: float, p99: float) -> dict:
    return {"requests": 1000, "errors": 0, "throughput_rps": rps, "p50_ms": p50, "p95_ms": p99 - 1, "p99_ms": p99}


def test_serving_section_states_ratios_and_the_floor():
    from bench.serving_bench import markdown

    before = {"1": _load(100.0, 9.0, 18.0), "16": _load(112.0, 140.0, 250.0)}
    after = {"1": _load(175.0, 5.5, 9.0), "16": _load(224.0, 70.0, 93.0)}
    fp32 = {"1": _load(118.0, 8.1, 15.0), "16": _load(159.0, 99.0, 136.0)}
    h11 = {"1": _load(150.0, 6.5, 13.0), "16": _load(230.0, 67.0, 99.0)}
    fp32_one = {"1": _load(95.0, 10.2, 16.0), "16": _load(175.0, 90.0, 120.0)}
    model = {"fp32": {"measured_ms": 8.0, "floor_ms": 5.0, "fraction": 0.625, "mean_tokens": 22.8, "gflop": 0.491,
                      "model_only_per_s": 250.0, "serving_floor_per_s": 400.0},
             "int8": {"measured_ms": 3.5, "floor_ms": 1.75, "fraction": 0.5, "mean_tokens": 22.8, "gflop": 0.491,
                      "model_only_per_s": 560.0, "serving_floor_per_s": 1120.0}}
    report = {"split": "test", "queries": 300, "seconds": 10.0, "clients": [1, 16],
              "peaks": {"cores": 2, "fp32_gflops_1": 96.0, "int8_gops_1": 282.0},
              "configurations": {"before (b7fc9f3)": {"PYTHONPATH": "/x"}, "default": {}, "fp32 queries": {"HYBRID_QUERY_PRECISION": "fp32"},
                                 "fp32 queries, one thread per search": {"HYBRID_QUERY_PRECISION": "fp32", "HYBRID_INFERENCE_THREADS": "1"},
                                 "h11 + asyncio": {"HYBRID_HTTP": "h11", "HYBRID_LOOP": "asyncio"}},
              "results": {"before (b7fc9f3)": before, "default": after, "fp32 queries": fp32,
                          "fp32 queries, one thread per search": fp32_one, "h11 + asyncio": h11}, "query_model": model}
    text = markdown(report)
    assert "| default | 175, 5.5 / 9 | 224, 70.0 / 93 | 0 |" in text
    assert "1 clients 1.75x, 16 clients 2.00x" in text  # 175 / 100, 224 / 112
    assert "| fp32 | 8.00 | 5.00 | 62% | 250 | 400 |" in text
    assert "default serves 224 req/s, 40% of what the int8 query model alone allows" in text  # 224 / 560
    assert "one thread per search 175 req/s (p99 120 ms), 70% of the fp32 model alone" in text  # 175 / 250
    assert "`HYBRID_HTTP=h11`, `HYBRID_LOOP=asyncio`" in text and "the previous commit's code, h11 and asyncio" in text


def test_rerank_section_lists_quality_latency_floor_and_how_each_was_trained(tmp_path):
    from bench.rerank_bench import markdown

    def trained(name: str, started: str, teacher: str | None, dev: tuple[float, float, float]) -> str:
        folder = tmp_path / name
        folder.mkdir()
        record = {"base_model": {"name": started}, "options": {"teacher": teacher},
                  "interpolation": {"dev": {"ndcg@10": dict(zip(("first_stage", "reranker_only", "interpolated"), dev))}}}
        (folder / "training.json").write_text(json.dumps(record))
        return str(folder)

    def latency(ms: float, floor: float, one_run_ms: float) -> dict:
        return {"side by side": {"measured_ms": ms, "floor_ms": floor, "fraction": round(floor / ms, 3)},
                "one run on all cores": {"measured_ms": one_run_ms, "floor_ms": floor, "fraction": round(floor / one_run_ms, 3)}}

    report = {"split": "test", "queries": 300, "depth": 50, "hybrid_ndcg@10": 0.73,
              "peaks": {"cores": 2, "fp32_gflops_2": 190.0, "int8_gops_2": 560.0},
              "rerankers": {"6 layers": {"layers": 6, "ndcg@10": {"fp32": 0.752, "int8": 0.75}, "weight": 0.5, "training_s": 1350.0,
                                         "path": trained("six", "all-MiniLM-L6-v2", None, (0.76, 0.67, 0.79)),
                                         "latency": {"fp32": latency(1500.0, 600.0, 1600.0), "int8": latency(1100.0, 200.0, 1300.0)}},
                            "2 layers": {"layers": 2, "ndcg@10": {"fp32": 0.745, "int8": 0.744}, "weight": 0.4, "training_s": 720.0,
                                         "path": trained("two", "models/six", "models/six", (0.76, 0.55, 0.78)),
                                         "latency": {"fp32": latency(500.0, 200.0, 510.0), "int8": latency(280.0, 70.0, 330.0)}}}}
    text = markdown(report)
    assert "| 2 layers | 2 | int8 | 0.7440 | 280 | 330 | 70 | 25% |" in text  # 70 / 280
    assert "| 6 layers | 6 | fp32 | 0.7520 | 1500 | 1600 | 600 | 40% |" in text
    assert "first stage alone 0.7300" in text and "190 GFLOP/s fp32, 560 GOP/s int8 on 2 cores" in text
    assert "| 6 layers | all-MiniLM-L6-v2 | 0.5 | 0.7600 | 0.6700 | 0.7900 | 22.5 |" in text
    assert "| 2 layers | its teacher | 0.4 | 0.7600 | 0.5500 | 0.7800 | 12.0 |" in text  # 720 s


def test_compute_floor_sentence_quotes_fractions():
    from bench.benchmarks_md import compute_floor_sentence

    floor = {"peaks": {"cores": 2, "fp32_gflops_1": 96.0, "fp32_gflops_2": 190.0},
             "query": {"mean_tokens": 22.8, "gflop": 0.491, "measured_ms": 5.2, "floor_ms": 2.58, "fraction": 0.496},
             "passage": {"mean_tokens": 250.0, "gflop": 5.6, "measured_per_s": 17.5, "floor_per_s": 33.9, "fraction": 0.516}}
    text = compute_floor_sentence(floor)
    assert "takes 5.20 ms vs a floor of 2.58 ms (50% of peak" in text and "17.5 passages/s vs a floor of 33.9 (52% of peak)" in text
    assert "96 GFLOP/s fp32 on one core, 190 on 2" in text


def test_query_section_adds_int8_documents_when_measured():
    from bench.query_bench import markdown

    report = {"split": "test", "queries": 300, "cosine_fp32_int8": {"min": 0.9862, "median": 0.993},
              "ndcg@10": {"dense": {"fp32": 0.6451, "int8": 0.648}}, "embed_p50_ms": {"fp32": 6.0, "int8": 3.0, "cache hit": 0.2},
              "documents": {"ndcg@10": {"dense": {"fp32": 0.648, "int8": 0.645}}, "passages_per_s": {"fp32": 20.0, "int8": 35.0},
                            "passages": 256, "rounds": 3, "floor": {"fp32": {"fraction": 0.5}, "int8": {"fraction": 0.25}}},
              "floor": {"peaks": {"cores": 2, "fp32_gflops_2": 190.0, "int8_gops_2": 560.0}, "fp32": {"fraction": 0.4},
                        "int8": {"fraction": 0.2}}}
    text = markdown(report)
    assert "| nDCG@10, dense | 0.6480 | 0.6450 | -0.0030 |" in text and "| indexing, passages/s | 20.0 | 35.0 | 1.75x |" in text
    assert "| fraction of the compute floor | 40% | 20% | |" in text and "| fraction of the compute floor | 50% | 25% | |" in text
    assert "(190 GFLOP/s fp32, 560 GOP/s int8)" in text


def test_shard_write_section_compares_before_and_after_a_write():
    from bench.shard_write_bench import markdown

    def row(before: float, after: float, rate: float) -> dict:
        return {"before": {"p50_ms": before, "p99_ms": 2 * before, "same_answers": 100},
                "after": {"p50_ms": after, "p99_ms": 2 * after, "same_answers": 99}, "upserts_per_s": rate}

    report = {"documents": 5183, "queries": 100, "write_docs": 64,
              "rows": {"whole": row(5.0, 8.0, 20.0), "2 shards": row(6.0, 10.0, 18.5)}}
    text = markdown(report)
    assert "| 2 shards | 6.00 | 10.00 | 20.00 | 1.25x | 99 of 100 | 18.5 |" in text  # 10 / 8
    assert "5.00 ms p50 before the write, 8.00 after (1.60x;" in text and "one batch of 64 upserts" in text
