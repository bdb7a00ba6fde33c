"""Fit hubness corrections into an index: banks in, per-document biases and activation sets out.

Files (under `hubness/` in the index, listed with checksums in the manifest):
    <column>.npy          LSE of each bank at its beta, float64 (n,)  (search.hubness.BIAS_COLUMNS)
    activation_query.npy / activation_gallery.npy     bool (n,)
    dense.faiss           inner-product index over d' = [d, -LSE columns]
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

from indexer import store
from indexer.corpus import read_qrels, read_queries
from search.dense import DenseIndex, FaissParams, build_faiss_index
from search.hubness import (
    BIAS_COLUMNS,
    HubnessCorrection,
    HubnessParams,
    HubnessSearcher,
    augment_documents,
    bank_statistics,
)

logger = logging.getLogger(__name__)

HUBNESS_DIR = "hubness"
AUGMENTED_FAISS = "dense.faiss"
DEFAULT_GALLERY_SIZE = 10_000


def load_bank(path: Path | str, split_qrels: Path | str | None = None) -> tuple[list[str], dict]:
    """Bank texts and a description of where they came from.

    `path` is a BEIR queries.jsonl (then `split_qrels` must name the split whose queries form the bank:
    test queries must never enter a bank), a plain text file with one query per line (a query log), or
    the word `pseudo`, which is resolved by the caller to document titles.
    """
    path = Path(path)
    if path.suffix == ".jsonl":
        if split_qrels is None:
            raise ValueError(f"{path} holds the queries of every split: pass --split-qrels (e.g. qrels/train.tsv) to choose the bank's split")
        split_qrels = Path(split_qrels)
        if split_qrels.stem == "test":
            raise ValueError(f"refusing {split_qrels}: test queries must never enter a bank; use a train or dev split")
        queries = read_queries(path)
        qids = list(read_qrels(split_qrels))
        missing = [q for q in qids if q not in queries]
        if missing:
            raise ValueError(f"{len(missing)} queries of {split_qrels} are missing from {path}, e.g. {missing[:3]}")
        return [queries[q] for q in qids], {"kind": "queries", "source": str(path), "split": str(split_qrels), "size": len(qids)}
    texts = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not texts:
        raise ValueError(f"{path}: no queries (expected one query per line)")
    return texts, {"kind": "query log", "source": str(path), "size": len(texts)}


def pseudo_bank(index: store.OpenIndex, size: int, seed: int = 0) -> tuple[list[str], dict]:
    """Fallback when no real queries exist: titles of sampled documents stand in for queries."""
    rng = np.random.default_rng(seed)
    picks = rng.choice(index.num_docs, size=min(size, index.num_docs), replace=False)
    titles = [t for t in (index.docs.get(int(i))["title"] for i in picks) if t.strip()]
    if not titles:
        raise ValueError("pseudo-query bank: the sampled documents have no titles")
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


def fit_hubness(index: store.OpenIndex, bank_texts: list[str], bank_info: dict, params: HubnessParams,
                default_method: str = "qbnorm", dynamic: bool = False, gallery_size: int = DEFAULT_GALLERY_SIZE,
                seed: int = 0, tuning: dict | None = None, bank: np.ndarray | None = None) -> dict:
    """Fit both corrections for `bank_texts` (embedded here unless `bank` holds their vectors), write
    them into the index folder and return the updated manifest."""
    index_dir = index.path
    started = time.perf_counter()
    bank = index.embedder.encode(bank_texts) if bank is None else bank
    embeddings = np.asarray(index.embeddings)
    correction, gallery = fit_correction(bank, embeddings, params, gallery_size, seed)
    faiss_params = FaissParams(**index.manifest["faiss"]["params"])

    tmp = Path(tempfile.mkdtemp(prefix=".hubness-", dir=index_dir))
    try:
        for name, lse in correction.lse.items():
            np.save(tmp / f"{name}.npy", lse)
        for name, mask in correction.activation.items():
            np.save(tmp / f"activation_{name}.npy", mask)
        import faiss

        faiss.write_index(build_faiss_index(augment_documents(embeddings, correction), faiss_params, "cpu"), str(tmp / AUGMENTED_FAISS))
        _swap_in(tmp, index_dir / HUBNESS_DIR)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    manifest = store.read_manifest(index_dir)
    manifest["files"] = {k: v for k, v in manifest["files"].items() if not k.startswith(f"{HUBNESS_DIR}/")}
    manifest["files"].update({f"{HUBNESS_DIR}/{k}": v for k, v in store.file_inventory(index_dir / HUBNESS_DIR).items()})
    manifest["hubness"] = {
        "default": {"method": default_method, "dynamic": dynamic},
        "params": asdict(params),
        "bank": {**bank_info, "sha256": _texts_digest(bank_texts)},
        "gallery": {"size": len(gallery), "seed": seed, "self_match": "excluded"},
        "activation": {name: int(mask.sum()) for name, mask in correction.activation.items()},
        "fit_seconds": round(time.perf_counter() - started, 2),
        **({"tuning": tuning} if tuning else {}),
    }
    store.write_manifest(index_dir, manifest)
    return manifest


def _texts_digest(texts: list[str]) -> str:
    import hashlib

    return hashlib.sha256("\n".join(texts).encode()).hexdigest()


def _swap_in(tmp: Path, target: Path) -> None:
    retired = target.with_name(f".{target.name}.retired-{int(time.time())}")
    if target.exists():
        target.rename(retired)
    tmp.rename(target)
    shutil.rmtree(retired, ignore_errors=True)


def load_hubness(index_dir: Path, manifest: dict, device: str = "auto") -> HubnessSearcher | None:
    """The fitted correction of an index, or None when it has none."""
    spec = manifest.get("hubness")
    if not spec:
        return None
    import faiss

    folder = index_dir / HUBNESS_DIR
    correction = HubnessCorrection(
        HubnessParams(**spec["params"]),
        lse={name: np.load(folder / f"{name}.npy") for name in BIAS_COLUMNS},
        activation={name: np.load(folder / f"activation_{name}.npy") for name in ("query", "gallery")},
    )
    augmented = DenseIndex(faiss.read_index(str(folder / AUGMENTED_FAISS)), FaissParams(**manifest["faiss"]["params"]), device)
    return HubnessSearcher(correction, augmented)
