"""Text embedders: ONNX Runtime (default, torch-free) and sentence-transformers (torch).

Both return L2-normalised float32 vectors, so inner product equals cosine similarity.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import numpy as np

from hybrid_retrieval.common.errors import SpecError
from hybrid_retrieval.models.batching import length_sorted, sequence_batch
from hybrid_retrieval.models.onnx_export import CONFIG_FILE, TOKENIZER_FILE, model_file, st_dimension
from hybrid_retrieval.models.providers import encoding_feeds, load_tokenizer, onnx_session, session_runs, torch_device

logger = logging.getLogger(__name__)


class Embedder(Protocol):
    dimension: int

    def encode(self, texts: Sequence[str], batch_size: int = 32) -> np.ndarray:
        """Return an (n, dimension) float32 array of unit vectors."""


NO_MODEL = "none"  # the embedder of a collection whose documents and queries bring their own vectors


def no_model_spec(dimension: int) -> dict:
    """The embedder description (models.onnx_export's embedder.json fields) of a collection without a model."""
    return {
        "model": NO_MODEL,
        "model_checksum": NO_MODEL,
        "dimension": dimension,
        "max_seq_length": 0,
        "pooling": NO_MODEL,
        "normalize": True,
        "inputs": [],
        "pad_token": "",
        "pad_token_id": 0,
    }


class NoEmbedder:
    """A collection without a model: its documents and dense searches bring their vectors; anything that would embed
    text is refused, naming the `vector` the request should carry."""

    def __init__(self, dimension: int):
        self.dimension = dimension

    def encode(self, texts: Sequence[str], batch_size: int = 32) -> np.ndarray:
        raise SpecError(
            "vector", f"this collection has no embedding model (its embedder is `none`): send the {self.dimension}-number `vector`"
        )


class OnnxEmbedder:
    """Embeds with an exported ONNX graph (pooling and normalisation inside the graph)."""

    def __init__(self, folder: Path, device: str = "auto", threads: int | None = None, precision: str = "fp32", workers: int | None = 1):
        """`workers`: batches run side by side on CPU (None: one per core), for offline embedding (a build, a
        re-embedding); a service embeds one query on all its cores, and side by side only under load
        (models.batching.LoadAwareEmbedder). A text's vector does not depend on which worker embeds it."""
        folder = Path(folder)
        self.config = json.loads((folder / CONFIG_FILE).read_text())
        self.dimension = int(self.config["dimension"])
        self._inputs = list(self.config["inputs"])
        self._tokenizer = load_tokenizer(
            folder / TOKENIZER_FILE, int(self.config["max_seq_length"]), int(self.config["pad_token_id"]), self.config["pad_token"]
        )
        self._runs = session_runs(device, workers, threads, "embedder")
        self.workers = self._runs.workers
        self._session = onnx_session(model_file(folder, precision), device, self._runs.threads)
        self.providers = self._session.get_providers()
        self.precision = precision

    def _encode_batch(self, texts: Sequence[str]) -> np.ndarray:
        feeds = encoding_feeds(self._tokenizer.encode_batch(list(texts)), self._inputs)
        return self._session.run(None, feeds)[0]

    def encode(self, texts: Sequence[str], batch_size: int = 32) -> np.ndarray:
        batch_size = sequence_batch(self.precision, batch_size)
        out = np.empty((len(texts), self.dimension), np.float32)
        return length_sorted(self._encode_batch, texts, batch_size, out, self._runs.map)

    def token_ids(self, texts: Sequence[str]) -> list[tuple[int, ...]]:
        """Each text as the model sees it (normalised, tokenised, truncated; no padding): the query cache's key."""
        return [tuple(e.ids[: sum(e.attention_mask)]) for e in self._tokenizer.encode_batch(list(texts))]


class TorchEmbedder:
    """Embeds with sentence-transformers (needs torch); the reference for the ONNX path."""

    def __init__(self, model_path: Path | str, device: str = "auto"):
        from sentence_transformers import SentenceTransformer

        self._model = SentenceTransformer(str(model_path), device=torch_device(device))
        self.dimension = st_dimension(self._model)

    def encode(self, texts: Sequence[str], batch_size: int = 32) -> np.ndarray:
        vectors = self._model.encode(list(texts), batch_size=batch_size, normalize_embeddings=True, convert_to_numpy=True)
        return np.asarray(vectors, dtype=np.float32).reshape(len(texts), self.dimension)
