"""Embedding an index build's documents on a Ray cluster: Ray Data reads the stored documents in blocks of
positions and a pool of actors embeds them (one ONNX session each, `num_gpus` per actor when the cluster has GPUs).
The rest of the build (documents, BM25 with its corpus-wide statistics, FAISS, manifest) is indexer.build's, so an
index built this way is the one a single process builds.

The workers read the documents and the model from the build folder: on several machines it must be on storage they
all mount (the driver writes it).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from hybrid_retrieval.cluster import connect
from hybrid_retrieval.common.errors import ConfigError
from hybrid_retrieval.indexer.build import EMBED_BATCH
from hybrid_retrieval.indexer.corpus import indexed_text
from hybrid_retrieval.indexer.store import DocStore
from hybrid_retrieval.models.embedder import OnnxEmbedder


class EmbedActor:
    """One ONNX session, reused for every block this actor is given."""

    def __init__(self, folder: str, onnx_folder: str, precision: str, device: str, batch_size: int):
        self.docs = DocStore(Path(folder))
        self.embedder = OnnxEmbedder(Path(onnx_folder), device=device, precision=precision)
        self.batch_size = batch_size

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        positions = batch["id"]
        texts = [indexed_text(doc["title"], doc["text"]) for doc in map(self.docs.get, positions.tolist())]
        return {"id": positions, "vector": np.asarray(self.embedder.encode(texts, batch_size=self.batch_size), np.float32)}


def ray_embed(
    address: str | None = None,
    actors: int = 1,
    precision: str = "fp32",
    device: str = "auto",
    batch_size: int = EMBED_BATCH,
    block_docs: int = 256,
) -> Callable[[Path, Path], np.ndarray]:
    """An `embed(folder, onnx_folder)` for indexer.build.build_index that runs on Ray (started locally when `address`
    is None)."""
    if actors < 1 or block_docs < 1:
        raise ConfigError(f"--embed-actors and the block size must be >= 1, got {actors} and {block_docs}")

    def embed(folder: Path, onnx_folder: Path) -> np.ndarray:
        ray = connect(address)
        count = len(DocStore(folder))
        gpus = ray.cluster_resources().get("GPU", 0) if device != "cpu" else 0
        # Ray Data's read tasks need a CPU beside the actors: an actor reserves half of one (its session still uses
        # every core it is given by the operating system; with --embed-actors 1 that is all of them)
        per_actor = {"num_gpus": 1} if gpus >= actors else {"num_cpus": 0.5}
        dataset = ray.data.range(count, override_num_blocks=max(1, -(-count // block_docs)))
        embedded = dataset.map_batches(
            EmbedActor,
            fn_constructor_kwargs={
                "folder": str(folder),
                "onnx_folder": str(onnx_folder),
                "precision": precision,
                "device": "gpu" if "num_gpus" in per_actor else "cpu",
                "batch_size": batch_size,
            },
            batch_size=block_docs,
            compute=ray.data.ActorPoolStrategy(size=actors),
            **per_actor,
        )
        vectors: np.ndarray | None = None
        for batch in embedded.iter_batches(batch_size=None, batch_format="numpy"):
            if vectors is None:
                vectors = np.empty((count, batch["vector"].shape[1]), dtype=np.float32)
            vectors[batch["id"]] = batch["vector"]
        assert vectors is not None  # build_index embeds no empty corpus
        return vectors

    return embed
