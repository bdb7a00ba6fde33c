"""Fit hubness corrections into an index: banks in, per-document biases and activation sets out.

Files (in a folder `hubness-<time>/` of the index that the manifest names, listed with checksums there):
    <column>.npy          LSE of each bank at its beta, float64 (n,)  (search.hubness.BIAS_COLUMNS)
    activation_query.npy / activation_gallery.npy     bool (n,)
    dense.faiss           inner-product index over d' = [d, -LSE columns]

A refit publishes a new folder, then switches the manifest to it in one atomic write, then removes
the old folder: a crash at any point leaves a manifest that names a complete correction.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import time
from dataclasses import replace
from pathlib import Path

import faiss
import numpy as np

from common.publish import publish_dir
from indexer.corpus import read_qrels, read_queries
from indexer.manifest import HubnessInfo, Manifest, update_manifest
from indexer.store import AUGMENTED_FAISS, OpenIndex, file_inventory
from search.dense import build_faiss_index
from search.errors import ConfigError
from search.hubness import (
    BIAS_COLUMNS,
    HubnessCorrection,
    HubnessParams,
    augment_documents,
    bank_statistics,
)
from search.spec import HubnessSpec

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
            raise ConfigError(f"{path} holds the queries of every split: pass --split-qrels (e.g. qrels/train.tsv) to choose the bank's split")
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


def fit_correction(bank: np.ndarray, embeddings: np.ndarray, params: HubnessParams,
                   gallery_size: int = DEFAULT_GALLERY_SIZE, seed: int = 0) -> tuple[HubnessCorrection, np.ndarray]:
    """Both methods' biases and activation sets; returns the correction and the gallery's doc indices."""
    lse_qb, activation_query = bank_statistics(bank, embeddings, params.beta, params.k)
    lse_db_query, _ = bank_statistics(bank, embeddings, params.beta1, params.k)
    gallery = sample_gallery(len(embeddings), gallery_size, seed)
    lse_db_gallery, activation_gallery = bank_statistics(embeddings[gallery], embeddings, params.beta2, params.k, self_idx=gallery)
    correction = HubnessCorrection(
        params,
        lse=dict(zip(BIAS_COLUMNS, (lse_qb, lse_db_query, lse_db_gallery))),
        activation={"query": activation_query, "gallery": activation_gallery},
    )
    return correction, gallery


def fit_hubness(index: OpenIndex, bank_texts: list[str], bank_info: dict, params: HubnessParams,
                default: HubnessSpec | None = None, gallery_size: int = DEFAULT_GALLERY_SIZE, seed: int = 0,
                tuning: dict | None = None, bank: np.ndarray | None = None, evidence: dict | None = None,
                beta_source: dict | None = None) -> Manifest:
    """Fit both corrections for `bank_texts` (embedded here unless `bank` holds their vectors), write
    them into the index folder. `default`, when given, becomes the index's hubness default (`evidence`: why);
    otherwise the default is no correction: one earned with an earlier fit does not carry over to new
    betas or a new bank. Returns the new manifest."""
    started = time.perf_counter()
    bank = index.embedder.encode(bank_texts) if bank is None else bank
    embeddings = np.asarray(index.embeddings)
    correction, gallery = fit_correction(bank, embeddings, params, gallery_size, seed)
    name = f"hubness-{time.strftime('%Y%m%dT%H%M%S')}-{time.time_ns() % 10**9:09d}"
    with publish_dir(index.path / name, replace=False) as tmp:
        for column, lse in correction.lse.items():
            np.save(tmp / f"{column}.npy", lse)
        for bank_name, mask in correction.activation.items():
            np.save(tmp / f"activation_{bank_name}.npy", mask)
        augmented = build_faiss_index(augment_documents(embeddings, correction), index.manifest.faiss.params, "cpu")
        faiss.write_index(augmented, str(tmp / AUGMENTED_FAISS))
    previous = index.manifest.hubness.folder if index.manifest.hubness else None

    def record(manifest: Manifest) -> None:
        kept = {f: v for f, v in manifest.files.items() if previous is None or not f.startswith(f"{previous}/")}
        manifest.files = {**kept, **file_inventory(index.path / name, prefix=f"{name}/")}
        manifest.defaults = replace(manifest.defaults, hubness=default or HubnessSpec())
        if default is None:
            manifest.evidence.pop("hubness", None)
        else:
            manifest.evidence["hubness"] = evidence
        manifest.hubness = HubnessInfo(
            folder=name, params=params, bank={**bank_info, "sha256": _texts_digest(bank_texts)},
            gallery={"size": len(gallery), "seed": seed, "self_match": "excluded"},
            activation={b: int(mask.sum()) for b, mask in correction.activation.items()},
            fit_seconds=round(time.perf_counter() - started, 2), tuning=tuning, beta_source=beta_source)

    manifest = update_manifest(index.path, record)
    if previous and previous != name:
        shutil.rmtree(index.path / previous, ignore_errors=True)
    return manifest


def _texts_digest(texts: list[str]) -> str:
    return hashlib.sha256("\n".join(texts).encode()).hexdigest()
