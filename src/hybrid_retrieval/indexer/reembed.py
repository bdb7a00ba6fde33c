"""Swap the dense half of an index: every document (written ones included) embedded again with another model,
a new FAISS index and model/ folder, published atomically in place of the old folder.

The documents, BM25 and metadata are rebuilt from the same documents, so they do not change. What was fitted
to the old model's scores cannot carry over as is: a hubness correction is dropped (training.reembed refits it)
and the fusion stays as it was (training.reembed re-tunes it when it was tuned).
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

from hybrid_retrieval.common.errors import ConfigError, HybridError
from hybrid_retrieval.common.publish import publish_dir, scratch_dir
from hybrid_retrieval.indexer.build import build_into, corpus_documents
from hybrid_retrieval.indexer.live.collection import Collection
from hybrid_retrieval.indexer.live.compaction import build_options_of, current_corpus
from hybrid_retrieval.indexer.live.log import LIVE_DIR, WAL_FILE
from hybrid_retrieval.indexer.manifest import Manifest, write_manifest
from hybrid_retrieval.indexer.representation import VectorSource
from hybrid_retrieval.indexer.store import OpenIndex, carry_reranker, open_index
from hybrid_retrieval.indexer.wal import WriteAheadLog
from hybrid_retrieval.models.batching import offline_workers
from hybrid_retrieval.models.embedder import OnnxEmbedder
from hybrid_retrieval.models.onnx_export import CONFIG_FILE
from hybrid_retrieval.models.profiles import PRECISION_PROFILES, export_profile
from hybrid_retrieval.models.registry import resolve_model

logger = logging.getLogger(__name__)


def reembed(
    index_dir: Path | str,
    model: str | None = None,
    precision: str | None = None,
    device: str = "auto",
    onnx_cache: Path | None = None,
    progress: bool = True,
    profile: str | None = None,
) -> Manifest:
    """Re-embed the index at `index_dir` with `model` (a name or path) in encoder `profile` (models.profiles), each
    default the index's; documents at `precision`, default the index's where the profile has it."""
    index_dir = Path(index_dir).resolve()
    index = open_index(index_dir, verify="size", device=device)
    if index.manifest.chunking.enabled:
        index.close()
        raise ConfigError(f"{index_dir} is chunked into passages, which re-embedding does not redo: rebuild it with the new model")
    wal = index_dir / LIVE_DIR / WAL_FILE
    try:
        old = index.manifest
        model = model or old.embedder.model
        profile = profile or old.embedder.profile
        precision = precision or (old.embedder.document_precision if profile in PRECISION_PROFILES else "fp32")
        options = replace(build_options_of(index), model=model, profile=profile, precision=precision, device=device, progress=progress)
        resolved = resolve_model(model)
        with scratch_dir(index_dir, "reembed") as work:  # locked while in use: a killed run's is swept at the next start

            def documents() -> Iterator[tuple[str, str]]:  # the small profile's sample, before the watch on writes starts
                return corpus_documents(_current(index, work / "sample")[0])()

            # the model first: distilling a student can take long, and writes meanwhile change only its sample
            started = time.perf_counter()
            onnx_folder = export_profile(resolved, profile, onnx_cache, documents, device, progress)
            embedder = OnnxEmbedder(onnx_folder, device=device, precision=options.precision, workers=offline_workers(options.precision))
            logged = _size(wal)  # before the documents are read: any write after it aborts the swap
            corpus, seq = _current(index, work)
            with contextlib.ExitStack() as swap, publish_dir(index_dir) as tmp:
                manifest = build_into(
                    tmp,
                    corpus,
                    options,
                    onnx_folder,
                    # the export cache is keyed by weights: one made from the same weights elsewhere names that path
                    {**json.loads((onnx_folder / CONFIG_FILE).read_text()), "model": resolved.name},
                    vectors=VectorSource(embedder=embedder),
                    started=started,
                )
                # every logged write is in the new base, embedded by the new model: the log starts afresh after them
                manifest.corpus, manifest.applied_sequence = old.corpus, seq
                manifest.defaults = old.defaults.merge({"hubness": {"method": "none"}})
                manifest.evidence = {name: value for name, value in old.evidence.items() if name != "hubness"}
                manifest.fusion_tuning = old.fusion_tuning
                carry_reranker(index_dir, tmp, manifest.files)  # its weight was tuned over the old first stage
                manifest.build["reembedded_from"] = {
                    "model": old.embedder.model,
                    "profile": old.embedder.profile,
                    "model_checksum": old.embedder.model_checksum,
                }
                write_manifest(tmp, manifest)
                swap.enter_context(_log_held(wal))  # until the swap: no write may land after this check
                if _size(wal) != logged:
                    raise HybridError(
                        f"{index_dir}: documents were written while re-embedding; nothing changed. "
                        "Pause writes (or stop the service) and run it again"
                    )
    finally:
        index.close()
    logger.info("re-embedded %d documents of %s with %s (%s profile)", manifest.documents, index_dir, model, profile)
    return manifest


def _current(index: OpenIndex, work: Path) -> tuple[Path, int]:
    """The index's documents as they are now (its log's writes replayed onto the base) as a JSONL corpus in `work`,
    and the sequence number of the last write in it."""
    collection = Collection(index)
    try:
        state = collection.view
        work.mkdir(exist_ok=True)
        corpus = current_corpus(index, state.base_alive, state.live.docs, work)
        return corpus, state.seq
    finally:
        collection.close()


@contextlib.contextmanager
def _log_held(wal: Path) -> Iterator[None]:
    """The index's log, locked: no other process writes to it meanwhile (HybridError when one holds it already)."""
    try:
        log = WriteAheadLog(wal, lock=True)
    except HybridError as exc:
        raise HybridError(f"{exc}; nothing changed: stop the service (or pause its writes) and run it again") from None
    try:
        yield
    finally:
        log.close()


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0
