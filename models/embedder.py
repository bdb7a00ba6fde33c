"""Text embedders: ONNX Runtime (default, torch-free) and sentence-transformers (torch).

Both return L2-normalised float32 vectors, so inner product equals cosine similarity.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Protocol, Sequence

import numpy as np

from models.onnx_export import CONFIG_FILE, ONNX_FILE, TOKENIZER_FILE
from models.providers import DEVICES, onnx_providers

logger = logging.getLogger(__name__)

BACKENDS = ("onnx", "torch")


class Embedder(Protocol):
    dimension: int

    def encode(self, texts: Sequence[str], batch_size: int = 32) -> np.ndarray:
        """Return an (n, dimension) float32 array of unit vectors."""


class OnnxEmbedder:
    """Embeds with an exported ONNX graph (pooling and normalisation inside the graph)."""

    def __init__(self, folder: Path, device: str = "auto", threads: int | None = None):
        import onnxruntime as ort
        from tokenizers import Tokenizer

        folder = Path(folder)
        self.config = json.loads((folder / CONFIG_FILE).read_text())
        self.dimension = int(self.config["dimension"])
        self._inputs = list(self.config["inputs"])
        self._tokenizer = Tokenizer.from_file(str(folder / TOKENIZER_FILE))
        self._tokenizer.enable_truncation(max_length=int(self.config["max_seq_length"]))
        self._tokenizer.enable_padding(pad_id=int(self.config["pad_token_id"]), pad_token=self.config["pad_token"])
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if threads:
            options.intra_op_num_threads = threads
        self.providers = onnx_providers(device)
        self._session = ort.InferenceSession(str(folder / ONNX_FILE), options, providers=self.providers)

    def _encode_batch(self, texts: Sequence[str]) -> np.ndarray:
        encodings = self._tokenizer.encode_batch(list(texts))
        feeds = {
            "input_ids": np.array([e.ids for e in encodings], dtype=np.int64),
            "attention_mask": np.array([e.attention_mask for e in encodings], dtype=np.int64),
            "token_type_ids": np.array([e.type_ids for e in encodings], dtype=np.int64),
        }
        return self._session.run(None, {name: feeds[name] for name in self._inputs})[0]

    def encode(self, texts: Sequence[str], batch_size: int = 32) -> np.ndarray:
        return _encode_length_sorted(self._encode_batch, texts, batch_size, self.dimension)


class TorchEmbedder:
    """Embeds with sentence-transformers (needs torch); the reference for the ONNX path."""

    def __init__(self, model_path: Path | str, device: str = "auto"):
        from sentence_transformers import SentenceTransformer

        if device not in DEVICES:
            raise ValueError(f"unknown device {device!r}; valid: {', '.join(DEVICES)}")
        torch_device = {"auto": None, "cpu": "cpu", "gpu": "cuda"}[device]
        self._model = SentenceTransformer(str(model_path), device=torch_device)
        self.dimension = st_dimension(self._model)

    def encode(self, texts: Sequence[str], batch_size: int = 32) -> np.ndarray:
        vectors = self._model.encode(list(texts), batch_size=batch_size, normalize_embeddings=True, convert_to_numpy=True)
        return np.asarray(vectors, dtype=np.float32).reshape(len(texts), self.dimension)


def st_dimension(st_model) -> int:
    """Embedding size of a SentenceTransformer (the method was renamed in sentence-transformers 6)."""
    getter = getattr(st_model, "get_embedding_dimension", None) or st_model.get_sentence_embedding_dimension
    return int(getter())


def _encode_length_sorted(encode_batch, texts: Sequence[str], batch_size: int, dimension: int) -> np.ndarray:
    """Batch texts of similar length together (less padding), return in input order."""
    out = np.empty((len(texts), dimension), dtype=np.float32)
    order = np.argsort([len(t) for t in texts], kind="stable")
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        out[idx] = encode_batch([texts[i] for i in idx])
    return out
