"""Dense retrieval with FAISS inner-product indexes over unit vectors (inner product = cosine)."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from hybrid_retrieval.common.devices import check_device
from hybrid_retrieval.common.errors import ConfigError
from hybrid_retrieval.common.progress import progress_bar
from hybrid_retrieval.search.filters.language import Allowed
from hybrid_retrieval.search.ranking import Ranking, top_k

logger = logging.getLogger(__name__)

FAISS_KINDS = ("flat", "ivf", "hnsw", "ivfpq", "sq8", "hnsw_sq8", "ivf_sq8")
IVF_KINDS = ("ivf", "ivfpq", "ivf_sq8")
HNSW_KINDS = ("hnsw", "hnsw_sq8")
# kinds that keep codes, not vectors, in memory (product-quantized, or 8-bit scalar: a byte a dimension); their
# candidates (`pq_refine` a result) are rescored with the stored full-precision vectors, memory-mapped from disk
COMPRESSED_KINDS = ("ivfpq", "sq8", "hnsw_sq8", "ivf_sq8")
# kinds whose index holds the vectors whole, in document order (a flat index, or an HNSW graph's flat storage): the
# stored vectors are read from it (flat_vectors), and an index folder keeps no second copy of them
WHOLE_KINDS = ("flat", "hnsw")
UNCOMPRESSED = {"ivfpq": "ivf", "ivf_sq8": "ivf", "sq8": "flat", "hnsw_sq8": "hnsw"}  # FaissParams.full_precision
SCAN_KINDS = ("flat", "sq8")  # every vector scored, no walk: exact (flat) or near it (sq8, then rescored)
FLAT_GATHER_CUTOFF = 1_000
TIE_MARGIN = 8  # results a dense search asks FAISS for beyond its cut, to see whether a tie crosses it (_past_ties)
ADD_CHUNK = 65_536  # vectors added to a FAISS index at a time on a CPU (a step of the build's progress)
EXACT_BELOW = 10_000  # the default: a vector index is exact (Flat) until it holds this many documents
# ...and then this kind: 8-bit codes in memory (a byte a number), in ~4*sqrt(n) clusters of which nprobe are scanned,
# candidates rescored from the stored vectors. An HNSW graph is built anew at each compaction (200,000 64-number
# vectors: 46 s on this 2-core machine); an IVF index is filled in one pass and keeps its training (trained_index).
SCALED_KIND = "ivf_sq8"
TRAIN_POINTS_PER_LIST = 64  # k-means points per IVF cluster (FAISS's 256: every vector of a million, at 4,000 clusters)
IVF_CLASSES = {"ivf": "IndexIVFFlat", "ivfpq": "IndexIVFPQ", "ivf_sq8": "IndexIVFScalarQuantizer"}


@dataclass(frozen=True)
class FaissParams:
    kind: str = "flat"
    nlist: int | None = None  # ivf: number of clusters (default ~4*sqrt(n))
    nprobe: int = 64  # ivf kinds: clusters visited per query
    hnsw_m: int = 32  # hnsw: links per node
    pq_m: int = 48  # ivfpq: sub-quantizers, each coding dimension / pq_m dimensions in one byte (must divide the dimension)
    pq_refine: int = 4  # ivfpq, sq8, hnsw_sq8: candidates fetched per result, rescored exactly with the stored vectors
    ef_construction: int = 200
    ef_search: int = 128
    # A filtered search whose filter admits at most this many documents scores them all exactly (brute force)
    # instead of searching the FAISS index with a selector (the "flat search cutoff" of Weaviate, Qdrant's
    # full-scan threshold): a graph or cluster walk through mostly excluded documents loses recall there.
    flat_search_cutoff: int = 10_000
    # Below this many vectors the index is exact (Flat) whatever `kind` says: a collection starts exact and moves to its
    # kind at the compaction that crosses it (an offline build of as many documents makes the same choice).
    exact_below: int = 0

    def __post_init__(self) -> None:
        if self.kind not in FAISS_KINDS:
            raise ConfigError(f"unknown FAISS index kind {self.kind!r}; valid: {', '.join(FAISS_KINDS)}")
        if isinstance(self.exact_below, bool) or not isinstance(self.exact_below, int) or self.exact_below < 0:
            raise ConfigError(f"exact_below must be an integer >= 0, got {self.exact_below!r}")
        for name in ("pq_m", "pq_refine"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")
        if isinstance(self.flat_search_cutoff, bool) or not isinstance(self.flat_search_cutoff, int) or self.flat_search_cutoff < 0:
            raise ConfigError(f"flat_search_cutoff must be an integer >= 0, got {self.flat_search_cutoff!r}")

    def check_dimension(self, dimension: int) -> None:
        """ivfpq codes dimension / pq_m dimensions in a byte: pq_m must divide the dimension (checked before any
        vector exists: a collection is exact until it holds `exact_below` of them)."""
        if self.kind == "ivfpq" and dimension % self.pq_m:
            raise ConfigError(f"pq_m (--pq-m) {self.pq_m} does not divide the embedding dimension {dimension}")

    def built_for(self, num_vectors: int) -> FaissParams:
        """These parameters as an index of `num_vectors` is built with them: Flat below `exact_below`, and for an IVF
        kind with too few vectors to train one cluster (39)."""
        if self.kind != "flat" and (num_vectors < self.exact_below or (self.kind in IVF_KINDS and num_vectors < 39)):
            return replace(self, kind="flat")
        return self

    def full_precision(self) -> FaissParams:
        """These parameters for an index that keeps its vectors whole, each compressed kind's uncompressed twin: a
        hubness correction's augmented index, whose bias dimensions 8-bit or product codes would blur."""
        return replace(self, kind=UNCOMPRESSED.get(self.kind, self.kind))

    def holds_vectors(self, num_vectors: int) -> bool:
        """Whether an index of `num_vectors` built with these parameters holds them whole (flat_vectors reads them)."""
        return self.built_for(num_vectors).kind in WHOLE_KINDS

    def factory(self, num_vectors: int, nlist: int | None = None) -> str:
        """The FAISS factory string of an index of `num_vectors` (`nlist`: an IVF index's clusters, when its training
        was reused rather than sized for `num_vectors`)."""
        if self.built_for(num_vectors).kind == "flat":
            return "Flat"
        nlist = nlist or self.resolved_nlist(num_vectors)
        if self.kind == "ivf":
            return f"IVF{nlist},Flat"
        if self.kind == "ivfpq":  # 8-bit codes: pq_m bytes a vector in memory (docs/SCALING.md)
            return f"IVF{nlist},PQ{self.pq_m}x8"
        if self.kind == "ivf_sq8":
            return f"IVF{nlist},SQ8"
        if self.kind == "hnsw":
            return f"HNSW{self.hnsw_m},Flat"
        if self.kind == "sq8":
            return "SQ8"
        if self.kind == "hnsw_sq8":
            return f"HNSW{self.hnsw_m},SQ8"
        return "Flat"

    def reuses(self, trained: Any, num_vectors: int, dimension: int) -> bool:
        """Whether the trained, empty index `trained` (an earlier build's, trained_index) can take `num_vectors` of
        `dimension` numbers as an index of these parameters: the same IVF kind (and code size) with between half and
        twice the clusters this many vectors would get. A collection that keeps growing is trained again each time it
        has grown fourfold or so: its clusters follow what it holds, at a cost that sums to about a third more than
        training once at its final size."""
        import faiss

        kind = self.built_for(num_vectors).kind
        if kind not in IVF_KINDS or trained.d != dimension or trained.ntotal or not trained.is_trained:
            return False
        ivf: Any = faiss.downcast_index(trained)  # faiss stubs: an Index, not its IVF subclass
        if type(ivf).__name__ != IVF_CLASSES[kind] or (kind == "ivfpq" and self.pq_m != ivf.pq.M):
            return False
        wanted, nlist = self.resolved_nlist(num_vectors), int(ivf.nlist)
        return wanted <= 2 * nlist and nlist <= 2 * wanted

    def resolved_nlist(self, num_vectors: int) -> int:
        # FAISS wants ~39 training points per centroid; never ask for more clusters than that allows.
        wanted = self.nlist or int(4 * math.sqrt(num_vectors))
        return max(1, min(wanted, num_vectors // 39))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# What an index gets unless told otherwise (`hybrid index`, a collection, BuildOptions): exact below EXACT_BELOW
# documents, SCALED_KIND from there. FaissParams() alone is flat at every size (what a comparison of kinds builds).
DEFAULT_PARAMS = FaissParams(kind=SCALED_KIND, exact_below=EXACT_BELOW)


def gpu_count() -> int:
    import faiss

    return int(faiss.get_num_gpus()) if hasattr(faiss, "get_num_gpus") else 0


def use_gpu(device: str, kind: str) -> bool:
    """Whether to run FAISS on GPU: `auto` uses one when the installed faiss sees it."""
    if check_device(device) == "cpu":
        return False
    available = gpu_count() > 0
    if kind in HNSW_KINDS or kind == "sq8" or not available:
        if device == "gpu":
            why = f"FAISS has no GPU version of {kind}" if available else "no GPU is visible to faiss"
            logger.warning("FAISS GPU requested but %s: using CPU", why)
        return False
    return True


def build_faiss_index(vectors: np.ndarray, params: FaissParams, device: str = "auto", progress: bool = False) -> Any:  # a faiss.Index
    """A CPU-serialisable FAISS index of `vectors` (see trained_index and fill)."""
    return fill(trained_index(vectors, params, device), vectors, params, device, progress)


def trained_index(vectors: np.ndarray, params: FaissParams, device: str = "auto", reuse: Any | None = None) -> Any:  # a faiss.Index
    """An empty index of `params` for `vectors`, trained on them (on GPU when available), or a copy of `reuse`, an
    earlier build's trained index, when `params.reuses` it: the clusters a compaction would train again are kept."""
    import faiss

    n, dim = vectors.shape
    params.check_dimension(dim)
    if reuse is not None and params.reuses(reuse, n, dim):
        return faiss.clone_index(reuse)
    params = params.built_for(n)
    index = faiss.index_factory(dim, params.factory(n), faiss.METRIC_INNER_PRODUCT)
    if params.kind in HNSW_KINDS:
        index.hnsw.efConstruction = params.ef_construction  # type: ignore[attr-defined]  # faiss stubs: an Index, not its HNSW subclass
    if params.kind in IVF_KINDS:
        faiss.extract_index_ivf(index).cp.max_points_per_centroid = TRAIN_POINTS_PER_LIST
    if params.kind == "ivfpq":
        # the factory turns on polysemous training (codebooks reordered for Hamming filtering, which we never search
        # with): same distances and rankings, but 50 times the training time
        faiss.downcast_index(index).do_polysemous_training = False  # type: ignore[attr-defined]  # an IndexIVFPQ
    if use_gpu(device, params.kind):
        gpu_index = faiss.index_cpu_to_all_gpus(index)
        gpu_index.train(vectors)
        return faiss.index_gpu_to_cpu(gpu_index)
    index.train(vectors)
    return index


def fill(index: Any, vectors: np.ndarray, params: FaissParams, device: str = "auto", progress: bool = False) -> Any:  # a faiss.Index
    """`index` (trained_index's) with `vectors` added: on GPU when available, else in chunks, with a progress bar
    when `progress` (an HNSW graph of millions of vectors takes minutes)."""
    import faiss

    n = len(vectors)
    if use_gpu(device, params.built_for(n).kind):
        gpu_index = faiss.index_cpu_to_all_gpus(index)
        gpu_index.add(vectors)
        return faiss.index_gpu_to_cpu(gpu_index)
    with progress_bar(n, "vector index", "vectors", progress) as bar:
        for start in range(0, n, ADD_CHUNK):
            index.add(vectors[start : start + ADD_CHUNK])
            bar.update(min(ADD_CHUNK, n - start))
    return index


def ivf_lists(index: Any) -> int | None:
    """An IVF index's number of clusters (None for other kinds)."""
    import faiss

    ivf = faiss.try_extract_index_ivf(index)
    return int(ivf.nlist) if ivf is not None else None


class DenseIndex:
    """Searches a FAISS index; queries are unit vectors from the index's own embedder."""

    def __init__(self, index: Any, params: FaissParams, device: str = "auto", vectors: np.ndarray | None = None) -> None:
        """`vectors`: the stored document vectors, with which a compressed index's approximate candidates (`pq_refine`
        per result) are rescored exactly, so its scores are cosines like every other kind's."""
        import faiss

        params = params.built_for(index.ntotal)
        self.params = params
        self.refine = params.pq_refine if params.kind in COMPRESSED_KINDS and vectors is not None else 1
        self.vectors = vectors
        self.num_docs = index.ntotal
        self.dimension = index.d
        if params.kind in IVF_KINDS:
            faiss.extract_index_ivf(index).nprobe = params.nprobe
        if params.kind in HNSW_KINDS:
            index.hnsw.efSearch = params.ef_search
        self.on_gpu = use_gpu(device, params.kind)
        self._index = faiss.index_cpu_to_all_gpus(index) if self.on_gpu else index

    def search_batch(self, queries: np.ndarray, depth: int, allowed: Allowed | None = None) -> list[Ranking]:
        """Top-`depth` per query; with `allowed`, among those documents only (see `brute_force`: the caller
        scores small allowed sets itself)."""
        queries = np.ascontiguousarray(queries, dtype=np.float32)
        if queries.ndim != 2 or queries.shape[1] != self.dimension:
            raise ValueError(f"query vectors must have shape (n, {self.dimension}), got {queries.shape}")
        fetch = depth * self.refine
        limit = self.num_docs if allowed is None else allowed.count
        if min(fetch, limit) == 0:  # FAISS asks for k > 0
            return [Ranking.empty() for _ in queries]
        params = None
        if allowed is not None:
            if self.on_gpu:
                raise ValueError("GPU FAISS indexes take no selector: filtered searches on GPU are brute force")
            params = self._filtered_params(faiss_selector(allowed), allowed, fetch)
        scores, ids = self._index.search(queries, min(fetch + TIE_MARGIN, limit), params=params)
        rankings = []
        vectors = self.vectors
        for query, row_scores, row_ids in zip(queries, scores, ids):
            found, found_scores = self._past_ties(query, row_ids, row_scores, fetch, limit, params)
            if self.refine > 1:
                assert vectors is not None  # refine > 1 only with the stored vectors

                def exact(ids: np.ndarray, v: np.ndarray = vectors, q: np.ndarray = query) -> np.ndarray:
                    scores: np.ndarray = v[ids] @ q
                    return scores

                rankings.append(exact_top_k(exact, np.sort(found), depth))
            else:
                rankings.append(Ranking(found, found_scores))
        return rankings

    def _past_ties(
        self, query: np.ndarray, row_ids: np.ndarray, row_scores: np.ndarray, fetch: int, limit: int, params: Any
    ) -> tuple[np.ndarray, np.ndarray]:
        """The first `fetch` results of one query, ties ordered by document index as everywhere else. FAISS orders
        equal scores (duplicate documents) as it likes and picks which of them make a cut, so a page could repeat a
        hit of the page before: the search asks for TIE_MARGIN more, and again for twice as many while the last
        result it got still ties with the one at the cut."""
        while True:
            keep = row_ids >= 0  # FAISS pads with -1 when fewer results exist
            found, found_scores = row_ids[keep].astype(np.int64), row_scores[keep]
            asked = len(row_ids)
            if asked >= limit or len(found) <= fetch or found_scores[-1] < found_scores[fetch - 1]:
                break
            row_scores, row_ids = (row[0] for row in self._index.search(query.reshape(1, -1), min(2 * asked, limit), params=params))
        order = np.lexsort((found, -found_scores))[:fetch]
        return found[order], found_scores[order]

    def search(self, query: np.ndarray, depth: int, allowed: Allowed | None = None) -> Ranking:
        return self.search_batch(query.reshape(1, -1), depth, allowed)[0]

    def brute_force(self, allowed: Allowed) -> bool:
        """The cost rule: score the allowed documents exactly rather than search FAISS with a selector, when
        they are few or the index is on GPU (GPU FAISS takes no selector). "Few" is `flat_search_cutoff` for IVF
        and HNSW, whose walks through mostly excluded documents lose recall or time; a flat index's selector
        scan is exact and beats gathering the vectors above about FLAT_GATHER_CUTOFF documents (docs/BENCHMARKS.md,
        "Filters, highlights, batches")."""
        cutoff = self.params.flat_search_cutoff
        if self.params.kind in SCAN_KINDS:
            cutoff = min(cutoff, FLAT_GATHER_CUTOFF)
        return self.on_gpu or allowed.count <= cutoff

    def _filtered_params(self, selector: Any, allowed: Allowed, depth: int) -> Any:  # faiss SearchParameters
        """Search parameters with the selector; ANN budgets grow with 1 / selectivity, so the walk meets about
        as many allowed documents as an unfiltered one would meet documents."""
        import faiss

        boost = 1.0 / max(allowed.fraction, 1e-9)
        if self.params.kind in IVF_KINDS:
            nlist = faiss.extract_index_ivf(self._index).nlist
            return faiss.SearchParametersIVF(sel=selector, nprobe=min(nlist, math.ceil(self.params.nprobe * boost)))  # type: ignore[call-arg]  # faiss stubs lack SWIG keyword arguments
        if self.params.kind in HNSW_KINDS:
            ef = min(self.num_docs, math.ceil(max(self.params.ef_search, depth) * boost))
            return faiss.SearchParametersHNSW(sel=selector, efSearch=max(ef, depth))  # type: ignore[attr-defined]  # missing from faiss stubs
        return faiss.SearchParameters(sel=selector)  # type: ignore[call-arg]  # faiss stubs lack SWIG keyword arguments


class _Borrowed:
    """A FAISS index's memory as an array's base: the array keeps the index (and its mapping) alive."""

    def __init__(self, index: Any, address: int, shape: tuple[int, int]):
        self.index = index
        self.__array_interface__ = {"data": (address, True), "shape": shape, "typestr": "<f4", "version": 3}


def flat_vectors(index: Any) -> np.ndarray | None:
    """The vectors a FAISS index holds whole (WHOLE_KINDS: flat, or an HNSW graph's flat storage), as a read-only
    array over its own memory (memory-mapped when it was read with IO_FLAG_MMAP_IFC), or None for any other kind: what
    the stored vectors are read for (rescoring, fusion) without a second copy of them."""
    import faiss

    flat = faiss.downcast_index(index)
    if isinstance(flat, faiss.IndexHNSWFlat):
        flat = faiss.downcast_index(flat.storage)
    if not isinstance(flat, faiss.IndexFlat):
        return None
    if flat.ntotal == 0:
        return np.empty((0, flat.d), dtype=np.float32)
    address = faiss.rev_swig_ptr(flat.get_xb(), 1).__array_interface__["data"][0]
    return np.asarray(_Borrowed(index, address, (flat.ntotal, flat.d)))  # `index` owns the memory (`flat` is a proxy)


def faiss_selector(allowed: Allowed) -> Any:  # a faiss.IDSelectorBitmap
    """An IDSelectorBitmap over the allowed mask (the packed bitmap lives as long as `allowed`)."""
    import faiss

    bitmap = allowed.bitmap
    return faiss.IDSelectorBitmap(len(allowed.mask), faiss.swig_ptr(bitmap))


def exact_top_k(score_of: Callable[[np.ndarray], np.ndarray], ids: np.ndarray, depth: int) -> Ranking:
    """Top-`depth` of documents `ids` (sorted) scored by `score_of(ids)`: the brute-force filtered search."""
    if not len(ids):
        return Ranking.empty()
    best = top_k(np.asarray(score_of(ids)), depth)
    return Ranking(ids[best.doc_idx], best.scores)
