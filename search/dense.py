"""Dense retrieval with FAISS inner-product indexes over unit vectors (inner product = cosine)."""

from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass

import numpy as np

from search.devices import check_device
from search.errors import ConfigError
from search.ranking import Ranking

logger = logging.getLogger(__name__)

FAISS_KINDS = ("flat", "ivf", "hnsw")


@dataclass(frozen=True)
class FaissParams:
    kind: str = "flat"
    nlist: int | None = None  # ivf: number of clusters (default ~4*sqrt(n))
    nprobe: int = 16  # ivf: clusters visited per query
    hnsw_m: int = 32  # hnsw: links per node
    ef_construction: int = 200
    ef_search: int = 128

    def __post_init__(self):
        if self.kind not in FAISS_KINDS:
            raise ConfigError(f"unknown FAISS index kind {self.kind!r}; valid: {', '.join(FAISS_KINDS)}")

    def factory(self, num_vectors: int) -> str:
        if self.kind == "ivf":
            return f"IVF{self.resolved_nlist(num_vectors)},Flat"
        if self.kind == "hnsw":
            return f"HNSW{self.hnsw_m},Flat"
        return "Flat"

    def resolved_nlist(self, num_vectors: int) -> int:
        # FAISS wants ~39 training points per centroid; never ask for more clusters than that allows.
        wanted = self.nlist or int(4 * math.sqrt(num_vectors))
        return max(1, min(wanted, num_vectors // 39))

    def to_dict(self) -> dict:
        return asdict(self)


def gpu_count() -> int:
    import faiss

    return faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else 0


def use_gpu(device: str, kind: str) -> bool:
    """Whether to run FAISS on GPU: `auto` uses one when the installed faiss sees it."""
    if check_device(device) == "cpu":
        return False
    available = gpu_count() > 0
    if kind == "hnsw" or not available:
        if device == "gpu":
            logger.warning("FAISS GPU requested but %s: using CPU", "HNSW has no GPU version" if available else "no GPU is visible to faiss")
        return False
    return True


def build_faiss_index(vectors: np.ndarray, params: FaissParams, device: str = "auto"):
    """Build a CPU-serialisable FAISS index (trained and filled on GPU when available)."""
    import faiss

    n, dim = vectors.shape
    index = faiss.index_factory(dim, params.factory(n), faiss.METRIC_INNER_PRODUCT)
    if params.kind == "hnsw":
        index.hnsw.efConstruction = params.ef_construction
    if use_gpu(device, params.kind):
        gpu_index = faiss.index_cpu_to_all_gpus(index)
        gpu_index.train(vectors)
        gpu_index.add(vectors)
        index = faiss.index_gpu_to_cpu(gpu_index)
    else:
        index.train(vectors)
        index.add(vectors)
    return index


class DenseIndex:
    """Searches a FAISS index; queries are unit vectors from the index's own embedder."""

    def __init__(self, index, params: FaissParams, device: str = "auto"):
        import faiss

        self.params = params
        self.num_docs = index.ntotal
        self.dimension = index.d
        if params.kind == "ivf":
            faiss.extract_index_ivf(index).nprobe = params.nprobe
        if params.kind == "hnsw":
            index.hnsw.efSearch = params.ef_search
        self.on_gpu = use_gpu(device, params.kind)
        self._index = faiss.index_cpu_to_all_gpus(index) if self.on_gpu else index

    def search_batch(self, queries: np.ndarray, depth: int) -> list[Ranking]:
        queries = np.ascontiguousarray(queries, dtype=np.float32)
        if queries.ndim != 2 or queries.shape[1] != self.dimension:
            raise ValueError(f"query vectors must have shape (n, {self.dimension}), got {queries.shape}")
        scores, ids = self._index.search(queries, min(depth, self.num_docs))
        rankings = []
        for row_scores, row_ids in zip(scores, ids):
            keep = row_ids >= 0  # FAISS pads with -1 when fewer results exist
            rankings.append(Ranking(row_ids[keep].astype(np.int64), row_scores[keep]))
        return rankings

    def search(self, query: np.ndarray, depth: int) -> Ranking:
        return self.search_batch(query.reshape(1, -1), depth)[0]
