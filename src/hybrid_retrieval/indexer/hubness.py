"""Fit hubness corrections into an index: banks in, per-document biases and activation sets out.

Files (in a folder `hubness-<time>/` of the index that the manifest names, listed with checksums there):
    <column>.npy          LSE of each bank at its beta, float64 (n,)  (search.hubness.BIAS_COLUMNS)
    activation_query.npy / activation_gallery.npy     bool (n,)
    dense.faiss           inner-product index over d' = [d, -LSE columns]
    bank_query.npy / bank_gallery.npy, gallery_ids.json      the banks (vectors; the gallery members' document ids)
    neighbours_<bank>_sims.npy / _idx.npy     each bank member's raw top-k (its part of the activation set)

The banks and neighbours let a live collection (indexer.live) give documents written later their biases and keep
the activation sets exact, as a fresh fit with the same banks would.

A refit publishes a new folder, then switches the manifest to it in one atomic write, then removes
the old folder: a crash at any point leaves a manifest that names a complete correction.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import time
from dataclasses import replace
from pathlib import Path

import faiss
import numpy as np

from hybrid_retrieval.common.errors import ConfigError
from hybrid_retrieval.common.publish import publish_dir
from hybrid_retrieval.indexer.corpus import read_qrels, read_queries
from hybrid_retrieval.indexer.manifest import HubnessInfo, Manifest, update_manifest
from hybrid_retrieval.indexer.store import AUGMENTED_FAISS, BANK_FILES, GALLERY_IDS, OpenIndex, file_inventory
from hybrid_retrieval.search.dense import build_faiss_index
from hybrid_retrieval.search.hubness import (
    BIAS_COLUMNS,
    Banks,
    HubnessCorrection,
    HubnessParams,
    augment_documents,
    bank_statistics,
)
from hybrid_retrieval.search.spec import HubnessSpec

logger = logging.getLogger(__name__)

DEFAULT_GALLERY_SIZE = 10_000
DEFAULT_PSEUDO_SIZE = 5_000


def load_bank(path: Path | str, split_qrels: Path | str | None = None) -> tuple[list[str], dict]:
    """Bank texts and a description of where they came from.

    `path` is a BEIR queries.jsonl (then `split_qrels` must name the split whose queries form the bank:
    test queries must never enter a bank), a plain text file with one query per line (a query log), or
    the word `pseudo`, which is resolved by the caller to document titles.
    """
    path = Path(path)
    if path.suffix == ".jsonl":
        if split_qrels is None:
            raise ConfigError(
                f"{path} holds the queries of every split: pass --split-qrels (e.g. qrels/train.tsv) to choose the bank's split"
            )
        split_qrels = Path(split_qrels)
        if split_qrels.stem == "test":
            raise ConfigError(f"refusing {split_qrels}: test queries must never enter a bank; use a train or dev split")
        queries = read_queries(path)
        qids = list(read_qrels(split_qrels))
        missing = [q for q in qids if q not in queries]
        if missing:
            raise ConfigError(f"{len(missing)} queries of {split_qrels} are missing from {path}, e.g. {missing[:3]}")
        return [queries[q] for q in qids], {"kind": "queries", "source": str(path), "split": str(split_qrels), "size": len(qids)}
    texts = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not texts:
        raise ConfigError(f"{path}: no queries (expected one query per line)")
    return texts, {"kind": "query log", "source": str(path), "size": len(texts)}


def pseudo_bank(index: OpenIndex, size: int, seed: int = 0) -> tuple[list[str], dict]:
    """Fallback when no real queries exist: titles of sampled documents stand in for queries."""
    rng = np.random.default_rng(seed)
    picks = rng.choice(index.num_docs, size=min(size, index.num_docs), replace=False)
    titles = [t for t in (index.docs.get(int(i))["title"] for i in picks) if t.strip()]
    if not titles:
        raise ConfigError("pseudo-query bank: the sampled documents have no titles")
    return titles, {"kind": "pseudo-queries (document titles)", "size": len(titles), "seed": seed}


def sample_gallery(num_docs: int, size: int, seed: int = 0) -> np.ndarray:
    """Sorted corpus indices of the gallery bank: a seeded sample, so tuning and fitting agree."""
    return np.sort(np.random.default_rng(seed).choice(num_docs, size=min(size, num_docs), replace=False))


def fit_correction(
    query_bank: np.ndarray, gallery_bank: np.ndarray, gallery_self: np.ndarray, embeddings: np.ndarray, params: HubnessParams
) -> tuple[HubnessCorrection, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """Both methods' biases and activation sets for given banks, in memory; `gallery_self[i]` is the corpus index of
    gallery member i's own document (-1: none). Returns the correction and each bank member's top-k (sims, doc idx)."""
    query = bank_statistics(query_bank, embeddings, params.beta, params.k)
    lse_db_query = bank_statistics(query_bank, embeddings, params.beta1, params.k).lse
    gallery = bank_statistics(gallery_bank, embeddings, params.beta2, params.k, self_idx=gallery_self)
    correction = HubnessCorrection(
        params,
        lse=dict(zip(BIAS_COLUMNS, (query.lse, lse_db_query, gallery.lse))),
        activation={"query": query.activation, "gallery": gallery.activation},
    )
    return correction, {"query": (query.top_sims, query.top_idx), "gallery": (gallery.top_sims, gallery.top_idx)}


def write_correction(folder: Path, correction: HubnessCorrection, banks: Banks, embeddings: np.ndarray, faiss_params) -> None:
    """The files of a fitted correction (module docstring) into `folder`."""
    for column, lse in correction.lse.items():
        np.save(folder / f"{column}.npy", lse)
    for bank_name, mask in correction.activation.items():
        np.save(folder / f"activation_{bank_name}.npy", mask)
    np.save(folder / BANK_FILES["query"], np.asarray(banks.query, dtype=np.float32))
    np.save(folder / BANK_FILES["gallery"], np.asarray(banks.gallery, dtype=np.float32))
    (folder / GALLERY_IDS).write_text(json.dumps(banks.gallery_ids, ensure_ascii=False), encoding="utf-8")
    for bank_name, (sims, idx) in banks.neighbours.items():
        np.save(folder / f"neighbours_{bank_name}_sims.npy", sims)
        np.save(folder / f"neighbours_{bank_name}_idx.npy", idx)
    augmented = build_faiss_index(augment_documents(embeddings, correction), faiss_params.full_precision(), "cpu")
    faiss.write_index(augmented, str(folder / AUGMENTED_FAISS))


def fit_hubness(  # noqa: PLR0913
    index: OpenIndex,
    bank_texts: list[str],
    bank_info: dict,
    params: HubnessParams,
    default: HubnessSpec | None = None,
    gallery_size: int = DEFAULT_GALLERY_SIZE,
    seed: int = 0,
    tuning: dict | None = None,
    bank: np.ndarray | None = None,
    evidence: dict | None = None,
    beta_source: dict | None = None,
    gallery: tuple[np.ndarray, list[str]] | None = None,
) -> Manifest:
    """Fit both corrections for `bank_texts` (embedded here unless `bank` holds their vectors), write
    them into the index folder. The gallery bank is a seeded sample of `gallery_size` documents, or `gallery`
    (vectors, ids): e.g. the banks of another fit. `default`, when given, becomes the index's hubness default
    (`evidence`: why); otherwise the default is no correction: one earned with an earlier fit does not carry over
    to new betas or a new bank. Returns the new manifest."""
    if index.passages is not None:
        raise ConfigError(f"{index.path} ranks documents by their passages: hubness correction fits one vector per document")
    started = time.perf_counter()
    bank = index.query_embedder.encode(bank_texts) if bank is None else bank
    embeddings = np.asarray(index.embeddings)
    if gallery is None:
        sample = sample_gallery(len(embeddings), gallery_size, seed)
        gallery = (embeddings[sample], [index.doc_ids[i] for i in sample])
        gallery_info = {"size": len(sample), "seed": seed, "self_match": "excluded"}
    else:
        gallery_info = {"size": len(gallery[1]), "given": True, "self_match": "excluded"}
    position = {doc_id: i for i, doc_id in enumerate(index.doc_ids)}
    gallery_self = np.array([position.get(doc_id, -1) for doc_id in gallery[1]], dtype=np.int64)
    correction, neighbours = fit_correction(bank, gallery[0], gallery_self, embeddings, params)
    banks = Banks(np.asarray(bank, dtype=np.float32), np.asarray(gallery[0], dtype=np.float32), list(gallery[1]), neighbours)
    name = correction_folder_name()
    with publish_dir(index.path / name, replace=False) as tmp:
        write_correction(tmp, correction, banks, embeddings, index.manifest.faiss.params)
    previous = index.manifest.hubness.folder if index.manifest.hubness else None

    def record(manifest: Manifest) -> None:
        kept = {f: v for f, v in manifest.files.items() if previous is None or not f.startswith(f"{previous}/")}
        manifest.files = {**kept, **file_inventory(index.path / name, prefix=f"{name}/")}
        manifest.defaults = replace(manifest.defaults, hubness=default or HubnessSpec())
        manifest.evidence.pop("hubness", None)  # an earlier fit's evidence is not this one's
        if default is not None and evidence is not None:
            manifest.evidence["hubness"] = evidence
        manifest.hubness = HubnessInfo(
            folder=name,
            params=params,
            bank={**bank_info, "sha256": _texts_digest(bank_texts)},
            gallery=gallery_info,
            activation={b: int(mask.sum()) for b, mask in correction.activation.items()},
            fit_seconds=round(time.perf_counter() - started, 2),
            tuning=tuning,
            beta_source=beta_source,
        )

    manifest = update_manifest(index.path, record)
    if previous and previous != name:
        shutil.rmtree(index.path / previous, ignore_errors=True)
    return manifest


def correction_folder_name() -> str:
    return f"hubness-{time.strftime('%Y%m%dT%H%M%S')}-{time.time_ns() % 10**9:09d}"


def _texts_digest(texts: list[str]) -> str:
    return hashlib.sha256("\n".join(texts).encode()).hexdigest()
