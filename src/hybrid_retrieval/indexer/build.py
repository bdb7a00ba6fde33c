"""Build an index folder from a corpus: documents, BM25, embeddings, FAISS, manifest.

The build goes into a hidden temporary folder next to the target and is published atomically
(common.publish) only when complete, so a failed or interrupted build never leaves a half-written
index and never damages the index it replaces.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib.metadata import version
from pathlib import Path
from typing import Any

import faiss
import numpy as np
import onnxruntime

from hybrid_retrieval.common.devices import check_device
from hybrid_retrieval.common.errors import ConfigError, HybridError
from hybrid_retrieval.common.memory import peak_memory_mib
from hybrid_retrieval.common.progress import progress_bar
from hybrid_retrieval.common.publish import link_or_copy, publish_dir
from hybrid_retrieval.indexer import store
from hybrid_retrieval.indexer.chunking import (
    ChunkingParams,
)
from hybrid_retrieval.indexer.corpus import corpus_file, count_records, read_corpus
from hybrid_retrieval.indexer.files import TRAINED_FAISS
from hybrid_retrieval.indexer.leftovers import remove_leftovers
from hybrid_retrieval.indexer.manifest import (
    MANIFEST,
    CorpusInfo,
    EmbedderInfo,
    FaissInfo,
    IndexOpenError,
    Manifest,
    read_manifest,
    write_manifest,
)
from hybrid_retrieval.indexer.representation import VectorBuild, VectorSource, drop_second_copy, representation_of
from hybrid_retrieval.models.batching import offline_workers
from hybrid_retrieval.models.embedder import NO_MODEL, OnnxEmbedder, TorchEmbedder
from hybrid_retrieval.models.onnx_export import PRECISIONS
from hybrid_retrieval.models.profiles import PRECISION_PROFILES, PROFILES, export_profile
from hybrid_retrieval.models.providers import BACKENDS
from hybrid_retrieval.models.registry import DEFAULT_MODEL, resolve_model
from hybrid_retrieval.search.analyzer import Analyzer
from hybrid_retrieval.search.bm25 import BM25Index, BM25Params
from hybrid_retrieval.search.dense import DEFAULT_PARAMS, IVF_KINDS, FaissParams, fill, ivf_lists, trained_index, use_gpu
from hybrid_retrieval.search.filters.columns import MetadataCollector, check_filterable
from hybrid_retrieval.search.postings import Postings, PostingsBuilder
from hybrid_retrieval.search.spec import SearchSpec
from hybrid_retrieval.search.synonyms import Synonyms

logger = logging.getLogger(__name__)

BUILDER_VERSION = "0.2.0"


EMBED_BATCH = 16  # documents per model run: the build's default, and the write path's (indexer.live)


@dataclass(frozen=True)
class BuildOptions:
    model: str = DEFAULT_MODEL
    profile: str = "full"  # the encoder profile (models.profiles): the model itself, a student or a static model made from it
    backend: str = "onnx"  # how documents are embedded; queries always use the exported ONNX model
    precision: str = "fp32"  # the ONNX weights that embed documents (and later writes): fp32 or int8
    analyzer: Analyzer = field(default_factory=Analyzer)
    bm25: BM25Params = field(default_factory=BM25Params)
    faiss: FaissParams = DEFAULT_PARAMS
    device: str = "auto"
    batch_size: int = EMBED_BATCH
    onnx_cache: Path | None = None
    progress: bool = True
    filterable: tuple[str, ...] | None = None  # metadata fields indexed for filters (None: every one that can be)
    field_types: dict | None = None  # every field whose type is decided already, None: not filterable (a compaction keeps its collection's)
    chunking: ChunkingParams = field(default_factory=ChunkingParams)  # none: one vector per document, of its head
    synonyms: tuple[dict, ...] = ()  # query-time synonym rules (search.synonyms), kept in the manifest

    def __post_init__(self):
        if self.backend not in (*BACKENDS, NO_MODEL):  # none: a collection's documents bring their vectors
            raise ConfigError(f"unknown embedding backend {self.backend!r}; valid: {', '.join(BACKENDS)}")
        if self.precision not in PRECISIONS:
            raise ConfigError(f"unknown document precision {self.precision!r}; valid: {', '.join(PRECISIONS)}")
        if self.profile not in PROFILES:
            raise ConfigError(f"unknown encoder profile {self.profile!r}; valid: {', '.join(PROFILES)}")
        if self.profile != "full" and self.backend != "onnx":
            raise ConfigError(f"the {self.profile} profile embeds with its ONNX graph (the torch backend embeds the full model)")
        if self.profile not in PRECISION_PROFILES and self.precision != "fp32":
            raise ConfigError(f"the {self.profile} profile embeds at fp32 only (it has no int8 weights)")
        if self.precision != "fp32" and self.backend != "onnx":
            raise ConfigError(f"{self.precision} document embedding needs the onnx backend, not {self.backend!r}")
        check_device(self.device)
        if self.batch_size < 1:
            raise ConfigError(f"batch size must be >= 1, got {self.batch_size}")
        Synonyms(list(self.synonyms), self.analyzer.analyze)  # refused here, naming the rule, not after the build


def _versions(analyzer: Analyzer) -> dict:
    # faiss and onnxruntime by module version: their CPU and GPU wheels have different distribution names
    packages = {name: version(name) for name in ("bm25s", "PyStemmer", "numpy", *analyzer.libraries())}
    return {
        "python": platform.python_version(),
        **packages,
        "faiss": faiss.__version__,
        "onnxruntime": onnxruntime.__version__,
        "platform": platform.platform(),
    }


def _make_embedder(options: BuildOptions, onnx_folder: Path, model_path: Path):
    if options.backend == "torch":
        return TorchEmbedder(model_path, device=options.device)
    return OnnxEmbedder(onnx_folder, device=options.device, precision=options.precision, workers=offline_workers(options.precision))


def _write_documents(
    source: Path,
    folder: Path,
    analyzer: Analyzer,
    metadata: MetadataCollector,
    progress: bool,
    allow_empty: bool,
    analysed: tuple[Postings, dict[str, int]] | None,
    stored_lines: bool,
) -> tuple[Postings, dict[str, int]]:
    """Pass 1 over the corpus: validate, store, analyse (unless `analysed` holds its postings already), collect
    metadata. Cheap, so errors surface before embedding. `stored_lines`: the corpus's lines are the store's as they
    are (store.document_line): the file is adopted as the store instead of written again."""
    writer = None if stored_lines else store.DocStoreWriter(folder)
    terms = PostingsBuilder()
    stored = 0
    try:
        # counted first (a read of the file, cheap next to analysing it) so that the bar can tell the time left
        with progress_bar(count_records(source) if progress else None, "documents", "docs", progress) as bar:
            for doc in read_corpus(source):
                if writer is not None:
                    writer.add(doc.doc_id, doc.title, doc.text, doc.metadata)
                metadata.add(doc.metadata)
                if analysed is None:
                    terms.add(analyzer.analyze(doc.indexed_text), analyzer.analyze(doc.title))
                stored += 1
                bar.update()
    finally:
        if writer is not None:
            writer.close()
    if stored_lines and store.adopt_lines(source, folder) != stored:
        raise HybridError(f"{source}: not a document store's lines (a line holds no document)")
    if not stored and not allow_empty:
        raise HybridError(f"{source}: corpus has no documents")
    if analysed is not None and analysed[0].num_docs != stored:
        raise HybridError(f"{source}: {stored} documents, but postings of {analysed[0].num_docs} were given")
    return analysed if analysed is not None else terms.finish()


def corpus_documents(source: Path) -> Callable[[], Iterator[tuple[str, str]]]:
    """The (title, text) pairs of the corpus at `source`, read when called (what the small profile distils on)."""
    return lambda: ((doc.title, doc.text) for doc in read_corpus(source))


def build_index(
    corpus: Path | str, out: Path | str, options: BuildOptions = BuildOptions(), embed: Callable[[Path, Path], np.ndarray] | None = None
) -> Manifest:
    """Build the index for `corpus` at `out` (replacing any index there) and return its manifest. `embed(folder,
    onnx_folder)`, when given, embeds the documents stored in `folder` (e.g. on a Ray cluster: cluster.build) and returns
    one vector per document in their order, in place of this process's embedder."""
    started = time.perf_counter()
    source = corpus_file(corpus)
    out = Path(out).resolve()
    if out.exists() and not (out / MANIFEST).is_file():
        raise HybridError(f"{out} exists and is not an index: refusing to replace it")
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_leftovers(out)
    model = resolve_model(options.model)
    onnx_folder = export_profile(model, options.profile, options.onnx_cache, corpus_documents(source), options.device, options.progress)
    # the export cache is keyed by weights: an export made from the same weights at another path names that path
    embedder_spec = {**json.loads((onnx_folder / "embedder.json").read_text()), "model": model.name}
    if embed is None:
        vectors = VectorSource(embedder=_make_embedder(options, onnx_folder, model.path))
    else:
        vectors = VectorSource(embed_folder=lambda folder: embed(folder, onnx_folder))

    with publish_dir(out) as tmp:
        manifest = build_into(tmp, source, options, onnx_folder, embedder_spec, vectors=vectors, started=started)
    logger.info("index of %d documents published at %s", manifest.documents, out)
    return manifest


def build_into(  # noqa: PLR0913
    tmp: Path,
    source: Path,
    options: BuildOptions,
    onnx_folder: Path | None,
    embedder_spec: dict,
    *,
    vectors: VectorSource = VectorSource(),
    started: float | None = None,
    collection: bool = False,
    checkpoint: Callable[[], None] = lambda: None,
    analysed: tuple[Postings, dict[str, int]] | None = None,
    stored_lines: bool = False,
    trained: Path | None = None,
) -> Manifest:
    """Write a complete index of the corpus `source` into the empty folder `tmp` (which the caller publishes).
    The documents' vectors come from `vectors` (indexer.representation: embedded, or as given), in the index's
    representation (whole documents, or passages: options.chunking). `collection`: the base of a collection (created
    empty, or compacted), which may be empty and may declare filterable fields no document has yet; else an empty
    corpus or such a field is an error. `checkpoint` runs between stages: what it raises ends the build (a compaction
    whose collection is being closed stops at the next stage instead of finishing a base nobody takes). `analysed`: the
    documents' postings and vocabulary when the caller has them (a compaction merges its segments'), in corpus order:
    the documents are not analysed again. `stored_lines`: the corpus is written as the document store keeps it (a
    compaction's current_corpus): adopted as the store, not written again. `trained`: the trained (empty) vector index
    of the index this one replaces (a compaction's), kept when it suits (search.dense.trained_index)."""
    started = time.perf_counter() if started is None else started
    t = time.perf_counter()
    timings = {"model_s": t - started}  # the export, or a profile's distillation, made before (build_index)
    collector = MetadataCollector(options.filterable, decided=options.field_types)
    postings, vocabulary = _write_documents(source, tmp, options.analyzer, collector, options.progress, collection, analysed, stored_lines)
    metadata = collector.finish()
    if options.filterable is not None and not collection:
        check_filterable(metadata.fields, options.filterable)
    metadata.save(tmp)
    timings["documents_s"] = time.perf_counter() - t
    checkpoint()

    t = time.perf_counter()
    bm25 = BM25Index.from_postings(postings, vocabulary, options.analyzer, options.bm25)
    bm25.save(tmp / store.BM25_DIR)
    postings.save(tmp)  # BM25 with live statistics after writes
    timings["bm25_s"] = time.perf_counter() - t
    del postings
    checkpoint()

    t = time.perf_counter()
    dimension = embedder_spec["dimension"]
    document_vectors, passage_count = _embed(tmp, options, onnx_folder, dimension, vectors)
    timings["embeddings_s"] = time.perf_counter() - t
    checkpoint()

    t = time.perf_counter()
    reuse = faiss.read_index(str(trained)) if trained is not None and trained.exists() else None
    faiss_index = trained_index(document_vectors, options.faiss, options.device, reuse)
    if options.faiss.built_for(len(document_vectors)).kind in IVF_KINDS:  # the next compaction's `trained`
        faiss.write_index(faiss_index, str(tmp / TRAINED_FAISS))
    faiss_index = fill(faiss_index, document_vectors, options.faiss, options.device, options.progress)
    faiss.write_index(faiss_index, str(tmp / store.FAISS_FILE))
    drop_second_copy(tmp / store.EMBEDDINGS, options.faiss, len(document_vectors))
    timings["faiss_s"] = time.perf_counter() - t

    if onnx_folder is not None:  # None: a collection without a model (its documents bring their vectors)
        shutil.copytree(onnx_folder, tmp / store.MODEL_DIR, copy_function=link_or_copy)
    manifest = _manifest(tmp, source, options, embedder_spec, faiss_index, bm25.vocabulary_size, passage_count, metadata.fields)
    manifest.build = {
        **{k: round(v, 3) for k, v in timings.items()},
        "total_s": round(time.perf_counter() - started, 3),
        "peak_rss_mib": peak_memory_mib(),
        "cpu_count": os.cpu_count(),
    }
    write_manifest(tmp, manifest)
    return manifest


def _embed(tmp: Path, options: BuildOptions, onnx_folder: Path | None, dimension: int, vectors: VectorSource) -> tuple[np.ndarray, int]:
    """The build's vectors stage, in the index's representation: each document's vector and the passages' count."""
    docs = store.DocStore(tmp)
    try:
        build = VectorBuild(
            tmp, docs, dimension, options.analyzer, options.bm25, options.faiss, options.device, options.batch_size, options.progress
        )
        return representation_of(options.chunking, onnx_folder, dimension).build(build, vectors)
    finally:
        docs.close()


def _manifest(
    tmp: Path,
    source: Path,
    options: BuildOptions,
    embedder_spec: dict,
    faiss_index: Any,  # the vector index built: one vector a document
    vocabulary_size: int,
    passage_count: int,
    fields: dict,
) -> Manifest:
    """The manifest of the index written into `tmp` (its build timings are the caller's to add)."""
    num_docs = faiss_index.ntotal
    return Manifest(
        builder_version=BUILDER_VERSION,
        created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        versions=_versions(options.analyzer),
        corpus=CorpusInfo(source=str(source), bytes=source.stat().st_size, sha256=store.sha256_file(source)),
        counts={"documents": num_docs, "bm25_vocabulary": vocabulary_size, **({"passages": passage_count} if passage_count else {})},
        analyzer=options.analyzer,
        bm25_engine="bm25s",
        bm25=options.bm25,
        embedder=EmbedderInfo(**embedder_spec, document_backend=options.backend, document_precision=options.precision),
        faiss=FaissInfo(
            factory=options.faiss.factory(num_docs, ivf_lists(faiss_index)),
            metric="inner_product",
            built_on_gpu=use_gpu(options.device, options.faiss.built_for(num_docs).kind),
            params=options.faiss,
        ),
        # Untuned: the library's default spec (equal-weight z-score fusion); `hybrid tune` replaces the fusion with
        # what won on labelled queries.
        defaults=SearchSpec(),
        files=store.file_inventory(tmp),
        metadata=fields,
        filterable=sorted(options.filterable) if options.filterable is not None else None,
        chunking=options.chunking,
        synonyms=list(options.synonyms),
    )


def index_is_current(corpus: Path | str, out: Path | str) -> bool:
    """`out` is an intact index built from a corpus with the checksum `corpus` has now."""
    try:
        manifest = read_manifest(out)
        store.verify_files(Path(out), manifest, "size")
    except IndexOpenError:
        return False
    return manifest.corpus.sha256 == store.sha256_file(corpus_file(corpus))
