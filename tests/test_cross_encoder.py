"""ONNX cross-encoder against the sentence-transformers reference, on real scifact text."""

import itertools
import json
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from scipy.stats import spearmanr

from hybrid_retrieval.models.cross_encoder import OnnxCrossEncoder, TorchCrossEncoder, load_cross_encoder
from hybrid_retrieval.models.onnx_export import export_cross_encoder
from hybrid_retrieval.models.registry import resolve_model

pytestmark = pytest.mark.training  # a cross-encoder made and exported with torch


@pytest.fixture(scope="module")
def cross_encoder_dir(tmp_path_factory):
    """A cross-encoder as `hybrid train-reranker` starts it: the bundled MiniLM with a seeded, untrained head."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    base = resolve_model()
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("cross-encoder") / "model"
    AutoModelForSequenceClassification.from_pretrained(str(base.path), num_labels=1).save_pretrained(out)
    AutoTokenizer.from_pretrained(str(base.path)).save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def export(cross_encoder_dir, tmp_path_factory):
    return export_cross_encoder(resolve_model(str(cross_encoder_dir)), cache_dir=tmp_path_factory.mktemp("onnx-cache"))


@pytest.fixture(scope="module")
def pairs(scifact):
    with (scifact / "corpus.jsonl").open() as fh:
        docs = [json.loads(line) for line in itertools.islice(fh, 16)]
    return "Vitamin D deficiency is linked to bone loss", [f"{d['title']} {d['text']}" for d in docs]


def test_onnx_fp32_ranks_like_torch(cross_encoder_dir, export, pairs):
    query, texts = pairs
    torch_scores = TorchCrossEncoder(cross_encoder_dir, device="cpu", max_length=512).score(query, texts)
    onnx_scores = OnnxCrossEncoder(export, device="cpu").score(query, texts)
    assert spearmanr(torch_scores, onnx_scores)[0] >= 0.99
    np.testing.assert_allclose(onnx_scores, torch_scores, atol=2e-3)


def test_int8_keeps_the_ranking_roughly(export, pairs):
    query, texts = pairs
    fp32 = OnnxCrossEncoder(export, device="cpu").score(query, texts)
    int8 = OnnxCrossEncoder(export, device="cpu", precision="int8").score(query, texts)
    assert spearmanr(fp32, int8)[0] >= 0.8


def test_scores_do_not_depend_on_batching(export, pairs):
    query, texts = pairs
    model = OnnxCrossEncoder(export, device="cpu")
    batched = model.score(query, texts[:6], batch_size=4)
    single = np.array([model.score(query, [t])[0] for t in texts[:6]])
    np.testing.assert_allclose(batched, single, atol=1e-4)
    assert model.score(query, []).shape == (0,)


# 8 texts make each caller's run two batches, enough to interleave; all 40 take 25 s, for the slow suite
@pytest.mark.parametrize(
    "precision, count",
    [("fp32", 8), ("int8", 8), pytest.param("fp32", 40, marks=pytest.mark.slow), pytest.param("int8", 40, marks=pytest.mark.slow)],
)
def test_runs_side_by_side_score_like_one_run_at_a_time(export, pairs, precision, count):
    query, texts = pairs[0], pairs[1][:count]
    serial = OnnxCrossEncoder(export, device="cpu", threads=1, workers=1, precision=precision)
    parallel = OnnxCrossEncoder(export, device="cpu", workers=3, precision=precision)
    assert (serial.workers, parallel.workers) == (1, 3)
    expected = serial.score(query, texts, batch_size=4)
    with ThreadPoolExecutor(4) as callers:  # concurrent reranks share the workers
        answers = list(callers.map(lambda _: parallel.score(query, texts, batch_size=4), range(4)))
    for scores in answers:  # int8 runs one pair at a time either way: the same products, bit for bit
        np.testing.assert_allclose(scores, expected, atol=1e-4 if precision == "fp32" else 0)
    for bad in ({"threads": 0}, {"workers": -1}):
        with pytest.raises(ValueError, match=f"{next(iter(bad))} must be at least 1"):
            OnnxCrossEncoder(export, device="cpu", **bad)


def test_loader_finds_the_export_and_rejects_bad_options(cross_encoder_dir, export):
    assert isinstance(load_cross_encoder(export, device="cpu"), OnnxCrossEncoder)
    assert load_cross_encoder(export, device="cpu", precision="auto").precision == "int8"  # as served on CPU
    with pytest.raises(ValueError, match="valid: auto, fp32, int8"):
        load_cross_encoder(export, device="cpu", precision="fp16")
    with pytest.raises(ValueError, match="valid: onnx, torch"):
        load_cross_encoder(export, backend="tensorrt")
    with pytest.raises(ValueError, match="int8 is an ONNX precision"):
        load_cross_encoder(cross_encoder_dir, backend="torch", precision="int8")
