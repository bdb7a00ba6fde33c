"""The index folder (its layout: indexer.files): manifest, document store, and opening with verification."""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import shutil
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any, BinaryIO

import faiss
import numpy as np

from hybrid_retrieval.common.errors import ConfigError
from hybrid_retrieval.common.publish import link_or_copy
from hybrid_retrieval.indexer.corpus import indexed_text
from hybrid_retrieval.indexer.files import BM25_DIR, DOC_OFFSETS, DOCS, EMBEDDINGS, FAISS_FILE, MODEL_DIR, RERANKER_DIR
from hybrid_retrieval.indexer.manifest import MANIFEST, IndexOpenError, Manifest, read_manifest
from hybrid_retrieval.indexer.representation import Representation, held_or_saved, representation_of
from hybrid_retrieval.models.embedder import NO_MODEL, Embedder, NoEmbedder, OnnxEmbedder, TorchEmbedder
from hybrid_retrieval.models.onnx_export import resolve_precision
from hybrid_retrieval.models.providers import on_gpu
from hybrid_retrieval.models.registry import ResolvedModel, resolve_model
from hybrid_retrieval.search.analyzer import Analyzer, AnalyzerError
from hybrid_retrieval.search.bm25 import BM25Index
from hybrid_retrieval.search.dense import DenseIndex
from hybrid_retrieval.search.filters.columns import MetadataColumns
from hybrid_retrieval.search.hits import Presenter
from hybrid_retrieval.search.hubness import BIAS_COLUMNS, Banks, HubnessCorrection, HubnessSearcher
from hybrid_retrieval.search.passages import PassageIndex
from hybrid_retrieval.search.pipeline import SearchPipeline
from hybrid_retrieval.search.postings import POSTINGS_DIR, Postings
from hybrid_retrieval.search.rerank import Reranker
from hybrid_retrieval.search.segments import LIVE_METHOD, LiveBM25, LiveSegment

logger = logging.getLogger(__name__)

VERIFY_MODES = ("full", "size", "none")
# A fitted hubness correction (indexer.hubness writes it): <bias column>.npy, activation_<bank>.npy, and
# dense.faiss over the augmented vectors [d, -bias columns].
ACTIVATION_BANKS = ("query", "gallery")
AUGMENTED_FAISS = "dense.faiss"
# Kept since live writes (fits before them lack these: such a correction cannot be extended to written documents).
BANK_FILES = {"query": "bank_query.npy", "gallery": "bank_gallery.npy"}
GALLERY_IDS = "gallery_ids.json"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def file_inventory(root: Path, prefix: str = "") -> dict[str, dict]:
    """{prefix + relative path: {bytes, sha256}} for every file under root except the manifest."""
    return {
        prefix + path.relative_to(root).as_posix(): {"bytes": path.stat().st_size, "sha256": sha256_file(path)}
        for path in sorted(root.rglob("*"))
        if path.is_file() and path.name != MANIFEST
    }


def carry_reranker(old: Path, new: Path, files: dict[str, dict]) -> None:
    """Hard-link the index's own reranker (RERANKER_DIR of index folder `old`) into the index being built at `new`,
    adding its files to the new inventory `files`: compaction and re-embedding keep it."""
    source = Path(old) / RERANKER_DIR
    if not source.is_dir():
        return
    shutil.copytree(source, Path(new) / RERANKER_DIR, copy_function=os.link)
    files.update(file_inventory(Path(new) / RERANKER_DIR, prefix=f"{RERANKER_DIR}/"))


COPY_CHUNK = 16 * 1024 * 1024  # bytes of stored documents read at a time when they are copied
ID_PREFIX = b'{"id": "'  # how document_line begins: the id is the JSON string that follows
ID_WINDOW = 64  # bytes read in bulk for each id; a longer or escaped one is read with its line
ID_ROWS = 65_536  # documents whose id windows are read at a time (a few MB of temporaries)


class DocStore:
    """Random access to stored documents by internal index, without loading the file."""

    def __init__(self, folder: Path):
        self._offsets = np.asarray(np.load(folder / DOC_OFFSETS, mmap_mode="r"))  # a plain array over the mapping: see BM25Index
        self._path = folder / DOCS
        self._fd: int | None = os.open(self._path, os.O_RDONLY)

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def get(self, doc_idx: int) -> dict:
        start, end = int(self._offsets[doc_idx]), int(self._offsets[doc_idx + 1])
        assert self._fd is not None, "read after close"
        return json.loads(os.pread(self._fd, end - start, start))  # pread: safe across threads

    def ids(self) -> list[str]:
        """Every document's id, in order, without decoding the documents (a restart of a million-document collection
        spent ~10 s in json.loads for them): the bytes between ID_PREFIX and the first quote, read for all documents
        at once; an id with an escape, or longer than ID_WINDOW, is decoded from its line. A quote or a backslash
        never occurs inside a UTF-8 sequence, and a JSON string holds neither unescaped, nor a raw newline."""
        if len(self) == 0:
            return []
        data = np.memmap(self._path, dtype=np.uint8, mode="r")
        columns = np.arange(ID_WINDOW)
        ids: list[str] = []
        for first in range(0, len(self), ID_ROWS):
            starts = self._offsets[first : min(first + ID_ROWS, len(self))]
            read = np.minimum(starts[:, None] + np.arange(len(ID_PREFIX) + ID_WINDOW), len(data) - 1)
            prefix, window = np.split(data[read], [len(ID_PREFIX)], axis=1)
            prefixed = np.all(prefix == np.frombuffer(ID_PREFIX, np.uint8), axis=1)
            quote = window == ord('"')
            end = quote.argmax(axis=1)
            inside = columns < end[:, None]
            plain = prefixed & quote.any(axis=1) & ~np.any(inside & (window == ord("\\")), axis=1)
            window[np.arange(len(window)), end] = ord("\n")  # each id ends at a newline: one decode for them all
            found = iter(window[plain][(inside | (columns == end[:, None]))[plain]].tobytes().decode().split("\n"))
            ids += [next(found) if simple else self.get(first + i)["id"] for i, simple in enumerate(plain.tolist())]
        return ids

    def copy_lines(self, doc_idx: np.ndarray, out: BinaryIO) -> None:
        """Write the stored lines of the documents `doc_idx` (ascending) to `out` as they are, run by run of
        consecutive documents: JSON lines a corpus reader takes (`id`, `title`, `text`, `metadata`)."""
        assert self._fd is not None, "read after close"
        for run in np.split(doc_idx, np.flatnonzero(np.diff(doc_idx) != 1) + 1) if len(doc_idx) else []:
            at, end = int(self._offsets[run[0]]), int(self._offsets[run[-1] + 1])
            while at < end:
                chunk = os.pread(self._fd, min(end - at, COPY_CHUNK), at)
                out.write(chunk)
                at += len(chunk)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __del__(self):  # a reloaded-away index is released when its last request finishes
        self.close()


class IdPositions(Mapping[str, int]):
    """Internal index by external document id in 16 bytes a document (the ids and a dict of them took 146 MB at 1M): the
    ids' hashes, sorted, beside their positions; a hash found is confirmed against the stored document, so ids of
    equal hash are told apart. Hashes are this process's (Python randomises them per process): never stored."""

    def __init__(self, docs: DocStore):
        ids = docs.ids()
        hashes = np.fromiter(map(hash, ids), dtype=np.int64, count=len(ids))
        self._positions = np.argsort(hashes, kind="stable")
        self._hashes, self._docs = hashes[self._positions], docs

    def get(self, doc_id: object, default: int | None = None) -> int | None:  # type: ignore[override]  # Mapping's overloads
        if not isinstance(doc_id, str):
            return default
        wanted = hash(doc_id)
        at = int(np.searchsorted(self._hashes, wanted))
        while at < len(self._hashes) and self._hashes[at] == wanted:
            position = int(self._positions[at])
            if self._docs.get(position)["id"] == doc_id:
                return position
            at += 1
        return default

    def __getitem__(self, doc_id: str) -> int:
        if (position := self.get(doc_id)) is None:
            raise KeyError(doc_id)
        return position

    def __contains__(self, doc_id: object) -> bool:
        return self.get(doc_id) is not None

    def __len__(self) -> int:
        return len(self._hashes)

    def __iter__(self) -> Iterator[str]:
        return iter(self._docs.ids())


def document_line(doc_id: str, title: str, text: str, metadata: dict) -> bytes:
    """A document as the store keeps it: one JSON line (which a corpus reader also takes)."""
    return json.dumps({"id": doc_id, "title": title, "text": text, "metadata": metadata}, ensure_ascii=False).encode() + b"\n"


def adopt_lines(source: Path, folder: Path) -> int:
    """Make the file `source`, of document_line lines only, the document store of `folder` (hard-linked where the
    filesystem allows: not written again); the number of documents."""
    link_or_copy(source, folder / DOCS)
    ends = [np.zeros(1, dtype=np.int64)]
    with (folder / DOCS).open("rb") as fh:
        at = 0
        while chunk := fh.read(COPY_CHUNK):
            ends.append(np.flatnonzero(np.frombuffer(chunk, dtype=np.uint8) == ord("\n")) + at + 1)
            at += len(chunk)
    offsets = np.concatenate(ends)
    np.save(folder / DOC_OFFSETS, offsets)
    return len(offsets) - 1


class DocStoreWriter:
    def __init__(self, folder: Path):
        self._fh = (folder / DOCS).open("wb")
        self._offsets = [0]
        self._folder = folder

    def add(self, doc_id: str, title: str, text: str, metadata: dict) -> None:
        data = document_line(doc_id, title, text, metadata)
        self._fh.write(data)
        self._offsets.append(self._offsets[-1] + len(data))

    def close(self) -> None:
        self._fh.close()
        np.save(self._folder / DOC_OFFSETS, np.asarray(self._offsets, dtype=np.int64))


def best_passage_text(doc: dict, passages: PassageIndex, doc_idx: int, vector: np.ndarray) -> str:
    """A chunked index's passage of the document nearest the query vector, with the document's title: what the
    reranker reads of it."""
    start, end = passages.best(doc_idx, vector)
    return indexed_text(doc["title"], doc["text"][start:end])


def verify_files(folder: Path, manifest: Manifest, mode: str = "full") -> None:
    """Check that every file of the manifest exists with its size (and checksum, in `full` mode)."""
    verify_inventory(folder, manifest.files, mode)


def verify_inventory(folder: Path, files: dict[str, dict], mode: str = "full") -> None:
    """Check that every file of an inventory (file_inventory) exists with its size (and checksum, in `full` mode)."""
    if mode not in VERIFY_MODES:
        raise ConfigError(f"unknown verify mode {mode!r}; valid: {', '.join(VERIFY_MODES)}")
    if mode == "none":
        return
    for rel, expected in files.items():
        path = folder / rel
        if not path.is_file():
            raise IndexOpenError(f"index file missing: {path}")
        size = path.stat().st_size
        if size != expected["bytes"]:
            raise IndexOpenError(f"index file {path} has {size} bytes, manifest says {expected['bytes']} (truncated or replaced)")
        if mode == "full" and sha256_file(path) != expected["sha256"]:
            raise IndexOpenError(f"index file {path} does not match its checksum in the manifest (corrupted)")


def _warn_on_analysis_change(manifest: Manifest) -> None:
    """Stemmer and segmenter releases rarely change outputs, but when they do, query terms stop matching."""
    for library in manifest.analyzer.libraries():
        built_with, installed = manifest.versions.get(library), version(library)
        if built_with and built_with != installed:
            logger.warning("index was built with %s %s, queries use %s: rebuild if BM25 results look off", library, built_with, installed)


@dataclass
class OpenIndex:
    """Everything a search needs, loaded once: share it across requests."""

    path: Path
    manifest: Manifest
    analyzer: Analyzer
    bm25: BM25Index
    dense: DenseIndex
    docs: DocStore
    embeddings: np.ndarray  # memory-mapped (n, dimension) unit vectors
    embedder: Embedder
    hubness: HubnessSearcher | None = None
    metadata: MetadataColumns | None = None  # None: no filterable field
    query_precision: str = "fp32"  # the weights queries are embedded with (models.onnx_export.resolve_precision)
    passages: PassageIndex | None = None  # a chunked index's passages: its dense leg ranks documents by them
    folder_id: tuple[int, int] | None = None  # folder_identity(path) when it was opened

    @functools.cached_property
    def representation(self) -> Representation:
        """Whole documents or passages: how writes to it are embedded and what a compaction carries."""
        return representation_of(self.manifest.chunking, self.path / MODEL_DIR, self.dense.dimension)

    @functools.cached_property
    def query_embedder(self):
        """What embeds queries (and query banks): the documents' embedder when the precisions agree, else a CPU session
        of the same model at `query_precision`, opened on first use."""
        if self.query_precision == self.manifest.embedder.document_precision:
            return self.embedder
        return OnnxEmbedder(self.path / MODEL_DIR, device="cpu", precision=self.query_precision)

    @property
    def num_docs(self) -> int:
        return len(self.docs)

    def doc_text(self, doc_idx: int) -> str:
        """The text both retrievers indexed (title and body), which a reranker reads too."""
        doc = self.docs.get(doc_idx)
        return indexed_text(doc["title"], doc["text"])

    def best_passage_text(self, doc_idx: int, vector: np.ndarray) -> str:
        assert self.passages is not None
        return best_passage_text(self.docs.get(doc_idx), self.passages, doc_idx, vector)

    @functools.cached_property
    def postings(self) -> Postings:
        """Term frequencies for BM25 with live statistics (search.postings), read on first use."""
        if not (self.path / POSTINGS_DIR).is_dir():
            raise IndexOpenError(
                f"{self.path} was built before live writes were supported (it has no {POSTINGS_DIR}/): "
                "rebuild it with `hybrid index` to accept writes"
            )
        return Postings.load(self.path)

    @functools.cached_property
    def doc_ids(self) -> list[str]:
        """External document ids by internal index (read once, on first use)."""
        return self.docs.ids()

    @functools.cached_property
    def doc_positions(self) -> IdPositions:
        """Internal index by external document id (built once, on first use)."""
        return IdPositions(self.docs)

    def document_by_id(self, doc_id: str) -> dict | None:
        idx = self.doc_positions.get(doc_id)
        return self.docs.get(idx) if idx is not None else None

    def pipeline(
        self, overrides: dict | None = None, executor=None, cross_encoder=None, cross_encoder_name: str = "", embedder=None
    ) -> SearchPipeline:
        """A search pipeline over this index whose defaults are the manifest's, with `overrides` (a partial
        spec: the service's settings) merged on. `cross_encoder` enables the rerank stage; `embedder`
        replaces the index's own (e.g. a batching wrapper around it)."""
        reranker = None
        if cross_encoder is not None:
            passage_text = self.best_passage_text if self.passages is not None else None
            reranker = Reranker(cross_encoder, self.doc_text, cross_encoder_name, passage_text_of=passage_text)
        return SearchPipeline(
            self.bm25,
            self.dense,
            embedder or self.query_embedder,
            self.embeddings,
            defaults=self.manifest.defaults.merge(overrides),
            executor=executor,
            hubness=self.hubness,
            reranker=reranker,
            metadata=self.metadata,
            passages=self.passages,
            positions_of=self.positions_of,
            fielded=lambda: self.fielded_bm25,
        )

    @functools.cached_property
    def fielded_bm25(self) -> LiveBM25 | None:
        """BM25 from the stored term frequencies, which weighs title and text (search.fields); None where the method
        is not lucene (the frequencies score the lucene variant only). Made at the first search that weighs fields."""
        if self.manifest.bm25.method != LIVE_METHOD or not (self.path / POSTINGS_DIR).is_dir():
            return None
        empty = LiveSegment([], self.manifest.embedder.dimension, {})
        return LiveBM25(self.bm25, self.postings, self.manifest.bm25, np.ones(self.num_docs, dtype=bool), empty)

    def positions_of(self, ids: Sequence[str]) -> list[int | None]:
        """Each document's position (None: no such document)."""
        return [self.doc_positions.get(doc_id) for doc_id in ids]

    def presenter(self, embedder=None) -> Presenter:
        """Builds the hits of this index's results (stored fields, highlights, facets); `embedder` as in `pipeline`."""
        return Presenter(
            self.docs.get, self.analyzer, embedder or self.embedder, list(self.manifest.metadata), self.metadata, passages=self.passages
        )

    def close(self) -> None:
        self.docs.close()


def model_identity(manifest: Manifest) -> str:
    """What model sessions and cached query embeddings are shared by across collections: a digest of the model files
    the index holds, as its inventory lists them (checked against their bytes by a restore, or a full verify), never
    the checksum its manifest claims, which a crafted snapshot could copy from another tenant's model."""
    model_files = sorted((rel, entry["sha256"]) for rel, entry in manifest.files.items() if rel.startswith(f"{MODEL_DIR}/"))
    if not model_files:
        return manifest.embedder.model_checksum
    return hashlib.sha256(json.dumps(model_files).encode()).hexdigest()


def stored_vectors(folder: Path, index: Any = None) -> np.ndarray:
    """The documents' vectors an index folder stores, in document order, memory-mapped: those its vector index holds
    whole (a flat or hnsw one: format 3 keeps no other copy), else embeddings.npy. `index`: its dense.faiss, read."""
    if index is None:
        index = faiss.read_index(str(folder / FAISS_FILE), faiss.IO_FLAG_MMAP_IFC)
    return held_or_saved(index, folder / EMBEDDINGS)


def open_index(folder: Path | str, verify: str = "full", device: str = "auto", embedder=None, query_precision: str = "auto") -> OpenIndex:
    """Open and verify an index; queries will use the analyzer and embedder it was built with, at `query_precision`
    (auto: int8 on CPU, fp32 on a GPU; see resolve_precision).

    `embedder` overrides the bundled ONNX embedder (e.g. the torch backend, which then embeds queries too); its model
    checksum must have been checked against the manifest by the caller (see `torch_embedder_for_index`).
    """
    folder = Path(folder)
    folder_id = folder_identity(folder)  # before reading: a folder swapped in meanwhile then counts as another
    manifest = read_manifest(folder)
    verify_files(folder, manifest, verify)
    _warn_on_analysis_change(manifest)
    try:
        bm25 = BM25Index.load(folder / BM25_DIR, manifest.analyzer)
    except AnalyzerError as exc:
        raise IndexOpenError(str(exc)) from None
    vectors = faiss.read_index(str(folder / FAISS_FILE), faiss.IO_FLAG_MMAP_IFC)  # a flat or 8-bit index's codes mapped
    embeddings = stored_vectors(folder, vectors)
    dense = DenseIndex(vectors, manifest.faiss.params, device, embeddings)
    docs = DocStore(folder)
    counts = {
        "documents": manifest.documents,
        "bm25": bm25.num_docs,
        "dense": dense.num_docs,
        "docs": len(docs),
        "embeddings": len(embeddings),
    }
    if len(set(counts.values())) != 1:
        raise IndexOpenError(f"{folder}: component sizes disagree {counts}")
    if embedder is None and manifest.embedder.document_backend == NO_MODEL:
        embedder = NoEmbedder(manifest.embedder.dimension)
    embedder = embedder or OnnxEmbedder(folder / MODEL_DIR, device=device, precision=manifest.embedder.document_precision)
    precision = (
        resolve_precision(query_precision, folder / MODEL_DIR, on_gpu(embedder)) if isinstance(embedder, OnnxEmbedder) else "fp32"
    )  # a torch embedder embeds queries itself
    if embedder.dimension != dense.dimension:
        raise IndexOpenError(f"embedder dimension {embedder.dimension} != index dimension {dense.dimension}")
    metadata = None
    if any(info.filterable for info in manifest.metadata.values()):
        metadata = MetadataColumns.load(folder, manifest.metadata, manifest.documents)
    passages = representation_of(manifest.chunking, folder / MODEL_DIR, manifest.embedder.dimension).load(folder, manifest, device)
    return OpenIndex(
        folder,
        manifest,
        manifest.analyzer,
        bm25,
        dense,
        docs,
        embeddings,
        embedder,
        _load_hubness(folder, manifest, device),
        metadata,
        precision,
        passages,
        folder_id,
    )


def folder_identity(folder: Path) -> tuple[int, int] | None:
    """The folder's (device, inode), None when it is gone. A folder published in its place (a restore, a reembed, a
    rebuild, a compaction) has another, so a process can tell that the folder it opened is no longer there."""
    try:
        stat = os.stat(folder)
    except FileNotFoundError:
        return None
    return stat.st_dev, stat.st_ino


def _load_hubness(folder: Path, manifest: Manifest, device: str) -> HubnessSearcher | None:
    """The fitted hubness correction of an index, or None when it has none."""
    if manifest.hubness is None:
        return None
    where = folder / manifest.hubness.folder
    correction = HubnessCorrection(
        manifest.hubness.params,
        lse={name: np.load(where / f"{name}.npy") for name in BIAS_COLUMNS},
        activation={bank: np.load(where / f"activation_{bank}.npy") for bank in ACTIVATION_BANKS},
    )
    augmented = DenseIndex(faiss.read_index(str(where / AUGMENTED_FAISS)), manifest.faiss.params.full_precision(), device)
    banks = None
    if (where / GALLERY_IDS).exists():
        query, gallery = (np.load(where / BANK_FILES[bank], mmap_mode="r") for bank in ACTIVATION_BANKS)
        banks = Banks(
            query,
            gallery,
            json.loads((where / GALLERY_IDS).read_text(encoding="utf-8")),
            {
                bank: (np.load(where / f"neighbours_{bank}_sims.npy"), np.load(where / f"neighbours_{bank}_idx.npy"))
                for bank in ACTIVATION_BANKS
            },
        )
    return HubnessSearcher(correction, augmented, banks)


def index_model(folder: Path | str) -> ResolvedModel:
    """The torch model the index was built with, after checking its checksum against the manifest."""
    spec = read_manifest(Path(folder)).embedder
    model = resolve_model(spec.model)
    if model.checksum != spec.model_checksum:
        if spec.profile != "full":
            raise IndexOpenError(
                f"the index embeds with the {spec.profile} profile's model, made from {spec.model!r} and not saved as a "
                "torch model: re-embed it with --profile full first (or build with a student's folder as --model)"
            )
        raise IndexOpenError(
            f"model {spec.model!r} resolves to weights with checksum {model.checksum[:12]}, "
            f"but the index was built with {spec.model_checksum[:12]}: queries would not match documents"
        )
    return model


def torch_embedder_for_index(folder: Path | str, device: str = "auto") -> TorchEmbedder:
    """The sentence-transformers embedder of the index's model, after checking its checksum."""
    return TorchEmbedder(index_model(folder).path, device=device)
