"""`hybrid bench --gpu`: a clear refusal without a GPU, and its section written in place (the run itself needs a GPU)."""

import pytest

from hybrid_retrieval.evaluation.report import write_section
from bench.gpu_bench import SECTION, check_gpu, markdown
from bench.machine import describe_machine
from hybrid_retrieval.search.dense import gpu_count
from tests.test_cli import hybrid

HAS_GPU = "CUDAExecutionProvider" in describe_machine()["onnx_providers"] and gpu_count() > 0


@pytest.mark.skipif(HAS_GPU, reason="this machine has a GPU: the refusal cannot be shown")
def test_without_a_gpu_the_command_says_why(tiny_index, tmp_path):
    result = hybrid("bench", tiny_index, "--data", tmp_path, "--gpu", "--markdown-file", tmp_path / "B.md")
    assert result.returncode == 2 and "needs a CUDA GPU for ONNX Runtime and FAISS" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "B.md").exists()
    with pytest.raises(Exception, match="FAISS sees 0 GPU"):
        check_gpu()


def _report(passages_per_s: float, gpu_qps: float) -> dict:
    row = lambda qps: {"qps": qps, "recall@10_vs_flat": 1.0, "build_s": 1.0}  # noqa: E731
    return {"machine": {"gpus": ["NVIDIA H100"], "cpu_model": "EPYC", "cpu_count": 16},
            "passage_embedding": {"passages_per_s": passages_per_s, "passages": 4096, "batch_size": 256},
            "query_embedding": {"gpu": {"p50_ms": 1.0}, "cpu": {"p50_ms": 4.0}},
            "faiss": {"vectors": 1_000_000, "dimension": 384, "queries": 1000,
                      "results": {"Flat cpu": row(200.0), "Flat gpu": row(gpu_qps)}}}


def test_the_section_replaces_its_previous_version_and_keeps_the_rest(tmp_path):
    doc = tmp_path / "BENCHMARKS.md"
    doc.write_text("# Benchmarks\n\n## Quality\n\nrows\n\n## Reproduce\n\nrun it\n")
    write_section(doc, markdown(_report(12_000.0, 4_000.0)))
    first = doc.read_text()
    assert first.index("## Quality") < first.index(SECTION) < first.index("## Reproduce")
    assert "**12,000 passages/s** (target 10,000: met)" in first and "Flat search GPU / CPU: 20.0x (target 10x: met)" in first
    write_section(doc, markdown(_report(8_000.0, 1_000.0)))
    second = doc.read_text()
    assert second.count(SECTION) == 1 and "12,000" not in second and "(target 10,000: not met)" in second
    assert "5.0x (target 10x: not met)" in second and second.endswith("## Reproduce\n\nrun it\n")
