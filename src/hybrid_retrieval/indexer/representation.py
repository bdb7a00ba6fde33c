"""How an index represents its documents as vectors: one vector per document (WholeDocuments), or one per passage of
a chunked index (Passages: indexer.chunking cuts them, and a document's own vector is its first passage's, what an
unchunked index would embed: its head). The build, the live writer, the log's replay, the compaction and the opening
of an index ask the index's representation (`representation_of`) what to do instead of branching on the chunking
flag; what a representation cannot do (re-embedding or sharding passages, hubness over them) is refused where it is
asked, naming the flag.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import faiss
import numpy as np

from hybrid_retrieval.common.errors import ConfigError, SpecError
from hybrid_retrieval.common.progress import progress_bar
from hybrid_retrieval.indexer.chunking import (
    PASSAGE_EMBEDDINGS,
    PASSAGE_FAISS,
    PASSAGE_ROWS,
    PASSAGE_SPANS,
    PASSAGES_DIR,
    Chunker,
    ChunkingParams,
    decode_passages,
    encode_passages,
    float32_text,
    save_passages,
    write_passages,
)
from hybrid_retrieval.indexer.corpus import indexed_text
from hybrid_retrieval.indexer.files import BM25_DIR, EMBEDDINGS
from hybrid_retrieval.indexer.manifest import IndexOpenError, Manifest
from hybrid_retrieval.models.embedder import Embedder
from hybrid_retrieval.search.analyzer import Analyzer
from hybrid_retrieval.search.bm25 import BM25Index, BM25Params
from hybrid_retrieval.search.dense import DenseIndex, FaissParams, build_faiss_index, flat_vectors
from hybrid_retrieval.search.passages import PassageIndex
from hybrid_retrieval.search.postings import Postings, PostingsBuilder
from hybrid_retrieval.search.segments import LIVE_METHOD, LiveSegment, PassageBM25

EMBED_CHUNK = 1024  # documents read and embedded per step of a build


class Documents(Protocol):
    """The stored documents of an index being built, in index order (indexer.store.DocStore)."""

    def __len__(self) -> int: ...

    def get(self, idx: int) -> dict[str, Any]: ...


@dataclass(frozen=True)
class PassageArrays:
    """A chunked index's passages as arrays: each one's span (start, end) in its document's text, its row (the
    document's position, ascending), and its vector."""

    spans: np.ndarray
    rows: np.ndarray
    vectors: np.ndarray


@dataclass(frozen=True)
class VectorSource:
    """Where a build's vectors come from: `documents` (one per document, in corpus order) and `passages` taken as given
    (a compaction's, or documents that bring their own), else made by `embed_folder(folder)` (the documents
    stored in the folder, embedded elsewhere: cluster.build), else embedded with `embedder`."""

    embedder: Embedder | None = None
    documents: np.ndarray | None = None
    passages: PassageArrays | None = None
    embed_folder: Callable[[Path], np.ndarray] | None = None


@dataclass(frozen=True)
class VectorBuild:
    """What a representation's build stage reads: the folder being built (its documents stored) and the build's
    settings."""

    folder: Path
    documents: Documents
    dimension: int
    analyzer: Analyzer
    bm25: BM25Params
    faiss: FaissParams
    device: str
    batch_size: int
    progress: bool


class Representation(Protocol):
    """One of WholeDocuments, Passages."""

    chunked: bool

    def build(self, build: VectorBuild, source: VectorSource) -> tuple[np.ndarray, int]:
        """Make and save the vectors of the documents stored in `build.folder`: each document's vector (saved as
        EMBEDDINGS) and the count of passages (0: none)."""
        ...

    def load(self, folder: Path, manifest: Manifest, device: str) -> PassageIndex | None:
        """What the index searches besides its document vectors."""
        ...

    def embed_writes(self, documents: list[dict], embed: Callable[[list[str]], np.ndarray]) -> tuple[list[dict], np.ndarray | None]:
        """Written documents (checked) as the log records them, embedding those that bring no vector, and each
        document's vector (None: the documents' vectors are not what a hubness correction extends)."""
        ...

    def check_logged(self, doc: dict, dimension: int) -> dict:
        """What a logged document carries besides the fields a write checks: SpecError or ValueError saying what is wrong."""
        ...

    def carried(self, passages: PassageIndex | None, base_alive: np.ndarray, live: LiveSegment) -> PassageArrays | None:
        """What a compaction gives the new base as it is, in the order of the documents it keeps then the written ones."""
        ...


def held_or_saved(index: Any, npy: Path) -> np.ndarray:
    """The vectors a read FAISS `index` holds whole (flat, hnsw: format 3 keeps no other copy), else those of the .npy
    beside it, memory-mapped either way."""
    held = flat_vectors(index)
    return held if held is not None else np.asarray(np.load(npy, mmap_mode="r"))  # a plain array: see BM25Index


def save_unless_held(npy: Path, vectors: np.ndarray, params: FaissParams) -> None:
    """Save `vectors` as `npy` unless their vector index, built with `params`, will hold them whole."""
    if not params.holds_vectors(len(vectors)):
        np.save(npy, np.asarray(vectors, dtype=np.float32))


def drop_second_copy(npy: Path, params: FaissParams, count: int) -> None:
    """Remove the .npy of `count` vectors written before their vector index (embedded into it), once that index,
    built with `params`, holds them whole."""
    if params.holds_vectors(count):
        npy.unlink(missing_ok=True)


def representation_of(chunking: ChunkingParams, model_folder: Path | None, dimension: int) -> Representation:
    """The representation of an index built with `chunking`, whose model's export is in `model_folder` (None: a
    collection without a model) and whose vectors have `dimension` numbers."""
    return Passages(chunking, model_folder) if chunking.enabled else WholeDocuments(dimension)


class WholeDocuments:
    """One vector per document: its title and text embedded together, or the vector it brought."""

    chunked = False

    def __init__(self, dimension: int):
        self.dimension = dimension

    def build(self, build: VectorBuild, source: VectorSource) -> tuple[np.ndarray, int]:
        vectors = source.documents
        if vectors is None and not len(build.documents):
            vectors = np.empty((0, build.dimension), dtype=np.float32)
        if vectors is None and source.embed_folder is not None:
            vectors = source.embed_folder(build.folder)
        if vectors is None:
            if source.embedder is None:
                raise ConfigError("an index without a model takes its documents' vectors as given")
            return _embed_documents(build, source.embedder), 0
        save_unless_held(build.folder / EMBEDDINGS, vectors, build.faiss)
        return vectors, 0

    def load(self, folder: Path, manifest: Manifest, device: str) -> None:
        return None

    def embed_writes(self, documents: list[dict], embed: Callable[[list[str]], np.ndarray]) -> tuple[list[dict], np.ndarray]:
        vectors = np.empty((len(documents), self.dimension), dtype=np.float32)
        missing = [i for i, doc in enumerate(documents) if "vector" not in doc]
        for i, doc in enumerate(documents):
            if "vector" in doc:
                vectors[i] = doc["vector"]
        if missing:
            vectors[missing] = embed([indexed_text(documents[i]["title"], documents[i]["text"]) for i in missing])
        return [{**doc, "vector": float32_text(v)} for doc, v in zip(documents, vectors)], vectors

    def check_logged(self, doc: dict, dimension: int) -> dict:
        if "passages" in doc:
            raise SpecError(("documents", doc["id"]), "passages in a record of an unchunked index")
        return {}

    def carried(self, passages: PassageIndex | None, base_alive: np.ndarray, live: LiveSegment) -> None:
        return None


class Passages:
    """One vector per passage, each passage embedded with its document's title; the document index keeps each
    document's first passage's vector. Passages also get their own BM25 (their terms, with live statistics)."""

    chunked = True

    def __init__(self, chunking: ChunkingParams, model_folder: Path | None):
        self.chunking, self.model_folder = chunking, model_folder

    @functools.cached_property
    def chunker(self) -> Chunker:
        """Passages are cut in the model's tokens (its export's tokenizer)."""
        if self.model_folder is None:
            raise ConfigError("a chunked index embeds its passages itself: it takes no document vectors")
        return Chunker(self.model_folder, self.chunking)

    def build(self, build: VectorBuild, source: VectorSource) -> tuple[np.ndarray, int]:
        given = source.passages
        vectors = source.documents
        if given is None and not len(build.documents):  # an empty collection: nothing to embed
            vectors = np.empty((0, build.dimension), dtype=np.float32)
            given = PassageArrays(np.empty((0, 2), np.int64), np.empty(0, np.int64), vectors)
        if given is not None:  # a compaction's: the documents' passages as they are, `documents` their first ones
            save_passages(build.folder, given.spans, given.rows, given.vectors)
        elif source.embedder is None:
            raise ConfigError("a chunked index embeds its passages itself: it takes no document vectors")
        else:
            embedder, documents = source.embedder, build.documents
            encode = lambda texts: embedder.encode(texts, batch_size=build.batch_size)
            stored = map(documents.get, range(len(documents)))
            vectors = write_passages(build.folder, stored, self.chunker, encode, embedder.dimension, build.progress)
        assert vectors is not None
        _index_passage_terms(build)
        where = build.folder / PASSAGES_DIR
        passage_vectors = np.load(where / PASSAGE_EMBEDDINGS)
        faiss.write_index(build_faiss_index(passage_vectors, build.faiss, build.device, build.progress), str(where / PASSAGE_FAISS))
        drop_second_copy(where / PASSAGE_EMBEDDINGS, build.faiss, len(passage_vectors))
        save_unless_held(build.folder / EMBEDDINGS, vectors, build.faiss)
        return vectors, len(passage_vectors)

    def load(self, folder: Path, manifest: Manifest, device: str) -> PassageIndex:
        where = folder / PASSAGES_DIR
        index = faiss.read_index(str(where / PASSAGE_FAISS), faiss.IO_FLAG_MMAP_IFC)
        vectors = held_or_saved(index, where / PASSAGE_EMBEDDINGS)
        rows, spans = np.load(where / PASSAGE_ROWS), np.load(where / PASSAGE_SPANS)
        counts = {"manifest": manifest.counts.get("passages", 0), "rows": len(rows), "vectors": len(vectors), "spans": len(spans)}
        if len(set(counts.values())) != 1 or (len(rows) and (rows[-1] >= manifest.documents or np.any(np.diff(rows) < 0))):
            raise IndexOpenError(f"{where}: passages disagree with the documents ({counts}, {manifest.documents} documents)")
        dense = DenseIndex(index, manifest.faiss.params, device, vectors)
        lexical = None
        if manifest.bm25.method == LIVE_METHOD and (where / BM25_DIR).is_dir():  # scored with live statistics: lucene only
            bm25 = BM25Index.load(where / BM25_DIR, manifest.analyzer)
            nothing = LiveSegment([], manifest.embedder.dimension, {})
            lexical = PassageBM25(bm25, Postings.load(where), manifest.bm25, rows, np.ones(len(rows), bool), nothing, manifest.documents)
        return PassageIndex(dense, vectors, rows, spans, manifest.documents, lexical)

    def embed_writes(self, documents: list[dict], embed: Callable[[list[str]], np.ndarray]) -> tuple[list[dict], None]:
        """A re-upsert replaces all of a document's passages in one record."""
        spans = [self.chunker.spans(doc["text"]) for doc in documents]
        texts = [indexed_text(doc["title"], doc["text"][span.start : span.end]) for doc, mine in zip(documents, spans) for span in mine]
        vectors = embed(texts)
        ends = np.cumsum([len(mine) for mine in spans])
        out = []
        for doc, mine, end in zip(documents, spans, ends):
            passages = vectors[end - len(mine) : end]
            out.append({**doc, "vector": float32_text(passages[0]), "passages": encode_passages(mine, passages)})
        return out, None

    def check_logged(self, doc: dict, dimension: int) -> dict:
        if "passages" not in doc:
            raise SpecError(("documents", doc["id"]), "no passages in a record of a chunked index")
        decode_passages(doc["passages"], doc["text"], dimension)  # ValueError saying what is wrong
        return {"passages": doc["passages"]}

    def carried(self, passages: PassageIndex | None, base_alive: np.ndarray, live: LiveSegment) -> PassageArrays:
        assert passages is not None  # a chunked index opens with its passages
        alive = np.flatnonzero(base_alive)
        ids = passages.passages_of(alive)
        counts = np.diff(passages.first)[alive]
        rows = np.concatenate([np.repeat(np.arange(len(alive), dtype=np.int64), counts), live.passage_rows + len(alive)])
        spans = np.concatenate([np.asarray(passages.spans)[ids], live.passage_spans])
        vectors = np.concatenate([np.asarray(passages.vectors)[ids], live.passage_vectors])
        return PassageArrays(spans, rows, vectors)


def _embed_documents(build: VectorBuild, embedder: Embedder) -> np.ndarray:
    """The stored documents embedded in chunks straight into a memory-mapped .npy file."""
    docs = build.documents
    path = build.folder / EMBEDDINGS
    vectors = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(len(docs), embedder.dimension))
    with progress_bar(len(docs), "embeddings", "docs", build.progress) as bar:
        for start in range(0, len(docs), EMBED_CHUNK):
            stop = min(start + EMBED_CHUNK, len(docs))
            texts = [indexed_text(doc["title"], doc["text"]) for doc in map(docs.get, range(start, stop))]
            vectors[start:stop] = embedder.encode(texts, batch_size=build.batch_size)
            bar.update(stop - start)
    vectors.flush()
    return np.load(path)


def _index_passage_terms(build: VectorBuild) -> None:
    """BM25 of a chunked index's passages: their vocabulary (bm25s) and postings, scored with live statistics."""
    where = build.folder / PASSAGES_DIR
    spans, rows = np.load(where / PASSAGE_SPANS), np.load(where / PASSAGE_ROWS)
    terms = PostingsBuilder()
    doc: dict[str, Any] = {}
    row_of_doc = -1
    for (start, end), row in zip(spans.tolist(), rows.tolist()):
        if row != row_of_doc:
            doc, row_of_doc = build.documents.get(row), row
        terms.add(build.analyzer.analyze(indexed_text(doc["title"], doc["text"][start:end])))
    postings, vocabulary = terms.finish()
    BM25Index.from_postings(postings, vocabulary, build.analyzer, build.bm25).save(where / BM25_DIR)
    postings.save(where)
