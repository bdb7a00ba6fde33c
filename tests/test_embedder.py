import itertools
import json
import logging

import numpy as np
import pytest

from hybrid_retrieval.common.errors import ConfigError
from hybrid_retrieval.models.embedder import OnnxEmbedder, TorchEmbedder
from hybrid_retrieval.models.onnx_export import export_onnx
from hybrid_retrieval.models.registry import ModelNotFoundError, resolve_model


@pytest.fixture(scope="module")
def model():
    return resolve_model()


@pytest.fixture(scope="module")
def onnx_embedder(model):
    return OnnxEmbedder(export_onnx(model), device="cpu")


def scifact_texts(scifact, n):
    with (scifact / "corpus.jsonl").open() as fh:
        return [json.loads(line)["text"] for line in itertools.islice(fh, n)]


@pytest.mark.training
def test_onnx_matches_torch_on_real_text(model, onnx_embedder, scifact):
    texts = scifact_texts(scifact, 24) + ["vitamin D deficiency", "Does smoking cause lung cancer?"]
    onnx = onnx_embedder.encode(texts)
    torch = TorchEmbedder(model.path, device="cpu").encode(texts)
    cosine = (onnx * torch).sum(axis=1)
    assert cosine.min() >= 0.999


def test_batched_equals_one_by_one(onnx_embedder):
    texts = ["short", "a somewhat longer sentence about proteins", "x " * 300]
    batched = onnx_embedder.encode(texts, batch_size=8)
    single = np.vstack([onnx_embedder.encode([t]) for t in texts])
    np.testing.assert_allclose(batched, single, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(batched, axis=1), 1.0, atol=1e-5)


def test_export_is_cached(model):
    folder = export_onnx(model)
    mtime = (folder / "model.onnx").stat().st_mtime_ns
    assert export_onnx(model) == folder and (folder / "model.onnx").stat().st_mtime_ns == mtime


def test_bundled_model_resolves_offline(model):
    assert model.path.is_dir() and len(model.checksum) == 64


def test_unknown_model_fails_with_a_clear_message():
    with pytest.raises(ModelNotFoundError, match="cannot resolve model 'no-such/model-xyz'"):
        resolve_model("no-such/model-xyz")


def test_int8_embedder_stays_close_to_fp32(model, onnx_embedder, scifact):
    texts = scifact_texts(scifact, 24) + ["vitamin D deficiency"]
    int8 = OnnxEmbedder(export_onnx(model), device="cpu", precision="int8").encode(texts)
    assert (int8 * onnx_embedder.encode(texts)).sum(axis=1).min() >= 0.97


def test_unknown_precision_lists_the_valid_ones(model):
    with pytest.raises(ValueError, match="valid: fp32, int8"):
        OnnxEmbedder(export_onnx(model), device="cpu", precision="fp16")


def test_int8_query_embeddings_agree_with_fp32(model, onnx_embedder, scifact):
    """The service can embed queries with the int8 graph (app.settings query_precision): it must stay close."""
    with (scifact / "queries.jsonl").open() as fh:
        queries = [json.loads(line)["text"] for line in itertools.islice(fh, 100)]
    int8 = OnnxEmbedder(export_onnx(model), device="cpu", precision="int8").encode(queries)
    assert (int8 * onnx_embedder.encode(queries)).sum(axis=1).min() >= 0.98


def test_int8_vectors_do_not_depend_on_the_batch(model, scifact):
    """int8 activations are quantised per tensor: batched runs would share one scale across texts (and padding)."""
    int8 = OnnxEmbedder(export_onnx(model), device="cpu", precision="int8")
    texts = scifact_texts(scifact, 6) + ["vitamin D deficiency"]
    np.testing.assert_array_equal(int8.encode(texts, batch_size=32), np.stack([int8.encode([t])[0] for t in texts]))


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_batches_side_by_side_embed_exactly_as_one_at_a_time(model, scifact, precision):
    """A build embeds a batch a core on one session: the same vectors, bit for bit, as one batch at a time."""
    texts = scifact_texts(scifact, 12) + ["vitamin D deficiency"]
    alone = OnnxEmbedder(export_onnx(model), device="cpu", precision=precision).encode(texts, batch_size=4)
    side_by_side = OnnxEmbedder(export_onnx(model), device="cpu", precision=precision, workers=3)
    assert side_by_side.workers == 3
    np.testing.assert_array_equal(side_by_side.encode(texts, batch_size=4), alone)
    with pytest.raises(ConfigError, match="embedder workers must be at least 1"):
        OnnxEmbedder(export_onnx(model), device="cpu", workers=0)


@pytest.mark.slow
def test_an_export_leaves_the_service_logging_alone(model, tmp_path):
    """The optimizer logs every fusion at INFO: the export quiets its loggers for the export alone, never the root
    logger that the service's access and lifecycle lines go through."""
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    export_onnx(model, cache_dir=tmp_path)  # a new cache: the export and the optimizer run
    assert root.level == logging.INFO
    assert logging.getLogger("app.access").isEnabledFor(logging.INFO)
    assert logging.getLogger("fusion_base").level == logging.NOTSET  # put back as it was
