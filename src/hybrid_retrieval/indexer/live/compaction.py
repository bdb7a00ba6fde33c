"""Compaction's steps: the collection's documents written out as a corpus, the new base segment built from them in a
folder (keeping the old base's tuned defaults and extending its hubness correction), the log carried into it, and
the folder opened again once published. The collection (indexer.live.collection) takes the locks and swaps.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np

from hybrid_retrieval.indexer.build import BuildOptions
from hybrid_retrieval.indexer.build_process import build_given
from hybrid_retrieval.indexer.files import TRAINED_FAISS
from hybrid_retrieval.indexer.hubness import correction_folder_name, write_correction
from hybrid_retrieval.indexer.live.log import LIVE_DIR, WAL_FILE
from hybrid_retrieval.indexer.live.validate import filterable_fields
from hybrid_retrieval.indexer.live.view import ReadView
from hybrid_retrieval.indexer.manifest import Manifest, write_manifest
from hybrid_retrieval.indexer.store import MODEL_DIR, OpenIndex, carry_reranker, document_line, file_inventory, open_index
from hybrid_retrieval.models.embedder import NO_MODEL, no_model_spec
from hybrid_retrieval.models.onnx_export import CONFIG_FILE
from hybrid_retrieval.search.postings import AddedTerms, TermMerge, with_titles
from hybrid_retrieval.search.segments import LiveDocument, title_tfs

VECTOR_CHUNK = 65_536  # vectors copied into the compaction's file at a time
OnCompact = Callable[[ReadView, Manifest, Path], None]  # what else goes into the new base folder before its manifest


def build_compacted(
    state: ReadView,
    corpus: Path,
    vectors: Path,
    folder: Path,
    on_compact: OnCompact | None = None,
    checkpoint: Callable[[], None] = lambda: None,
) -> None:
    """The new base of `state` in `folder`: built from its documents (`corpus` and `vectors`: current_corpus's and current_vectors' files;
    what its representation carries as it is: a chunked index's passages), with what it keeps of the old base and what
    `on_compact(state, manifest, folder)` adds; the manifest is written last. The build runs in a child process when
    the collection is large (indexer.build_process). `checkpoint` runs between stages and may stop the build."""
    checkpoint()  # after current_corpus, as long as a stage for a large collection
    index = state.index
    options = replace(build_options_of(index), field_types=dict(state.field_types))
    model = index.path / MODEL_DIR if index.manifest.embedder.document_backend != NO_MODEL else None
    manifest = build_given(
        folder,
        corpus,
        options,
        model,
        json.loads((model / CONFIG_FILE).read_text()) if model is not None else no_model_spec(index.manifest.embedder.dimension),
        vectors,
        work=corpus.parent,
        documents=state.documents,
        passages=index.representation.carried(index.passages, state.base_alive, state.live),
        analysed=merged_terms(state),
        collection=True,
        stored_lines=True,
        trained=index.path / TRAINED_FAISS,
        checkpoint=checkpoint,
    )
    checkpoint()
    _carry_over(state, manifest, folder, np.load(vectors, mmap_mode="r"))
    if on_compact is not None:
        on_compact(state, manifest, folder)
    write_manifest(folder, manifest)


def merged_terms(state: ReadView) -> TermMerge:
    """The postings of current_corpus's documents, to be merged from the base's (its alive documents) and the live
    segment's: the documents' terms as a fresh analysis gives them, without analysing the collection again."""
    live = state.live
    by_id = sorted(live.vocabulary, key=live.vocabulary.__getitem__)
    added = AddedTerms.of([(doc.term_ids, doc.tfs, doc.length, title_tfs(doc), doc.title_length) for doc in live.docs], by_id)
    index, base = state.index, state.index.postings
    base_folder: Path | None = index.path
    if not base.has_fields:  # built before fields: its titles are analysed once, so that the compacted index has them
        titles = (index.analyzer.analyze(index.docs.get(i)["title"]) for i in range(index.num_docs))
        base, base_folder = with_titles(base, index.bm25.vocabulary, titles), None
    return TermMerge(base, index.bm25.vocabulary, state.base_alive, added, base_folder)


def link_log(path: Path, folder: Path) -> None:
    """The log of the index at `path` into the new base `folder` (a hard link: the same file)."""
    (folder / LIVE_DIR).mkdir()
    wal = path / LIVE_DIR / WAL_FILE
    if wal.exists():
        os.link(wal, folder / LIVE_DIR / WAL_FILE)


def reopen(index: OpenIndex) -> OpenIndex:
    """The index's folder opened again (a compaction published a new base there), on the same device, embedder and
    query precision."""
    return open_index(
        index.path,
        verify="size",
        device="gpu" if index.dense.on_gpu else "cpu",
        embedder=index.embedder,
        query_precision=index.query_precision,
    )


def current_corpus(index: OpenIndex, base_alive: np.ndarray, live: list[LiveDocument], work: Path) -> Path:
    """The collection's documents as a JSONL corpus in `work` (alive base documents in order, then live ones). Its
    lines are those of the document store (the base's copied as they are), so that the new base adopts the file as its
    store (build_into's `stored_lines`)."""
    corpus = work / "corpus.jsonl"
    with corpus.open("wb") as fh:
        index.docs.copy_lines(np.flatnonzero(base_alive), fh)
        for written in live:
            fh.write(document_line(written.doc_id, written.title, written.text, written.metadata))
    return corpus


def current_vectors(index: OpenIndex, base_alive: np.ndarray, live: list[LiveDocument], work: Path) -> Path:
    """The vectors of current_corpus's documents, in its order, as an .npy file in `work`."""
    vectors = work / "vectors.npy"
    alive = np.flatnonzero(base_alive)
    out = np.lib.format.open_memmap(vectors, mode="w+", dtype=np.float32, shape=(len(alive) + len(live), index.dense.dimension))
    for start in range(0, len(alive), VECTOR_CHUNK):
        chunk = alive[start : start + VECTOR_CHUNK]
        out[start : start + len(chunk)] = index.embeddings[chunk]
    if live:
        out[len(alive) :] = np.stack([doc.vector for doc in live])
    out.flush()
    del out
    return vectors


def build_options_of(index: OpenIndex) -> BuildOptions:
    """The build options the index was made with (the filterable fields it kept, when they were restricted)."""
    filterable = filterable_fields(index.manifest)
    return BuildOptions(
        model=index.manifest.embedder.model,
        profile=index.manifest.embedder.profile,
        backend=index.manifest.embedder.document_backend,
        precision=index.manifest.embedder.document_precision,
        analyzer=index.analyzer,
        bm25=index.manifest.bm25,
        faiss=index.manifest.faiss.params,
        device="cpu",
        progress=False,
        filterable=tuple(sorted(filterable)) if filterable is not None else None,
        chunking=index.manifest.chunking,
    )


def _carry_over(state: ReadView, new: Manifest, folder: Path, vectors: np.ndarray) -> None:
    """What the compacted base (in `folder`, of `vectors`) keeps of the old: its tuned defaults and their evidence, its own
    reranker, and a
    fitted hubness correction, extended to the written documents (what a fresh fit with the same banks gives). A
    correction fitted before fits kept their banks cannot be extended: it is dropped (refit it)."""
    old = state.index.manifest
    new.defaults, new.evidence, new.overrides, new.synonyms = old.defaults, dict(old.evidence), dict(old.overrides), list(old.synonyms)
    new.curation = list(old.curation)
    new.fusion_tuning, new.corpus, new.applied_sequence = old.fusion_tuning, old.corpus, state.seq
    carry_reranker(state.index.path, folder, new.files)
    if old.hubness is None:
        return
    if state.hubness is None:
        new.defaults = old.defaults.merge({"hubness": {"method": "none"}})
        new.evidence.pop("hubness", None)
        return
    alive = np.concatenate([state.base_alive, np.ones(len(state.live), dtype=bool)])
    assert state.index.hubness is not None  # a live correction extends the base's
    correction, banks = state.hubness.compacted(state.index.hubness, alive)
    name = correction_folder_name()
    (folder / name).mkdir()
    write_correction(folder / name, correction, banks, vectors, old.faiss.params)
    new.files.update(file_inventory(folder / name, prefix=f"{name}/"))
    new.hubness = replace(old.hubness, folder=name, activation={b: int(m.sum()) for b, m in correction.activation.items()})
