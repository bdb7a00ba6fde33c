"""Hubness correction over a collection that changes: equal to a fresh fit of its documents with the same banks.

With the banks fixed, a document's biases depend on that document alone (LSE over a bank of beta * s(b, d)), so the
base's biases stay valid and a written document's are computed once, when it is written. What changes are the
activation sets of the dynamic variants: the union of each bank member's raw top-k among the documents that exist.
Each member's top-k is kept, merged with every written document, and recomputed exactly (brute force over the
documents that exist) for the members whose top-k lost a document.

Documents are keyed: a base document by its index (0 .. n-1), a written one by n + a serial number the collection
gives it (stable, while positions in the live segment shift as documents come and go).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import numpy as np

from hybrid_retrieval.search.dense import DenseIndex
from hybrid_retrieval.search.hubness import BIAS_COLUMNS, Banks, HubnessCorrection, HubnessSearcher, activation_mask, update_top_k
from hybrid_retrieval.search.segments import LiveDense

_DOC_CHUNK = 4096


def _lse(logits: np.ndarray) -> np.ndarray:
    """logsumexp over axis 0 (bank members), in float64."""
    logits = logits.astype(np.float64)
    top = logits.max(axis=0)
    safe = np.where(np.isfinite(top), top, 0.0)
    lse: np.ndarray = safe + np.log(np.exp(logits - safe).sum(axis=0))
    return lse


@dataclass(frozen=True)
class Prepared:
    """Bank similarities of a batch of documents (members x documents) and their biases (documents x BIAS_COLUMNS)."""

    query: np.ndarray
    gallery: np.ndarray
    biases: np.ndarray


class LiveHubness:
    """The mutable state: written documents' biases and each bank member's top-k keys. Not thread-safe: the
    collection calls it under its write lock."""

    def __init__(self, base: HubnessSearcher, base_docs: int) -> None:
        banks = base.banks
        assert banks is not None  # a live collection extends only a correction fitted with its banks
        self.params, self.base_docs = base.correction.params, base_docs
        self._bank = {"query": np.asarray(banks.query, dtype=np.float32), "gallery": np.asarray(banks.gallery, dtype=np.float32)}
        self._gallery_ids = banks.gallery_ids
        self._rows_of_id: dict[str, list[int]] = {}
        for row, doc_id in enumerate(banks.gallery_ids):
            self._rows_of_id.setdefault(doc_id, []).append(row)
        self._top = {bank: (sims.copy(), idx.copy()) for bank, (sims, idx) in banks.neighbours.items()}
        self._stale = {bank: np.zeros(len(vectors), dtype=bool) for bank, vectors in self._bank.items()}
        self._lse: dict[int, np.ndarray] = {}  # key of a written document -> its biases, in BIAS_COLUMNS order

    def prepare(self, doc_ids: list[str], vectors: np.ndarray) -> Prepared:
        """The bank products of documents about to be written (reads only the fixed banks: no lock needed, so a
        writer computes them before it takes the collection's write lock)."""
        vectors = np.asarray(vectors, dtype=np.float32)
        query = self._bank["query"] @ vectors.T
        gallery = self._bank["gallery"] @ vectors.T
        for col, doc_id in enumerate(doc_ids):
            gallery[self._rows_of_id.get(doc_id, []), col] = -np.inf  # a gallery member is not its own document's neighbour
        p = self.params
        biases = np.column_stack([_lse(p.beta * query), _lse(p.beta1 * query), _lse(p.beta2 * gallery)])
        return Prepared(query, gallery, biases)

    def add(self, keys: np.ndarray, prepared: Prepared) -> None:
        """Written documents (`prepare`d, in `keys` order): their biases, and every member's top-k merged with them."""
        for key, row in zip(keys, prepared.biases):
            self._lse[int(key)] = row
        update_top_k(*self._top["query"], prepared.query, keys)
        update_top_k(*self._top["gallery"], prepared.gallery, keys)

    def remove(self, keys: list[int]) -> None:
        """Documents gone (deleted, or replaced by a new version): members that had one in their top-k are recomputed."""
        for key in keys:
            self._lse.pop(key, None)
        for bank, (_, idx) in self._top.items():
            self._stale[bank] |= np.isin(idx, keys).any(axis=1)

    def view(
        self,
        base_embeddings: np.ndarray,
        base_alive: np.ndarray,
        live_keys: np.ndarray,
        live_vectors: np.ndarray,
        key_of: Callable[[str], int],
    ) -> LiveHubnessView:
        """The correction's state over the joint numbering (base, then live in `live_keys` order). `key_of(id)`: the
        key of the document with that id that exists now, -1 if none."""
        for bank, stale in self._stale.items():
            if stale.any():
                self._recompute(bank, np.flatnonzero(stale), base_embeddings, base_alive, live_keys, live_vectors, key_of)
                stale[:] = False
        live_keys = np.asarray(live_keys, dtype=np.int64)
        sorter = np.argsort(live_keys)

        def positions(keys: np.ndarray) -> np.ndarray:
            out: np.ndarray = keys.copy()
            live = keys >= self.base_docs
            out[live] = self.base_docs + sorter[np.searchsorted(live_keys, keys[live], sorter=sorter)]
            return out

        live_lse = np.array([self._lse[int(k)] for k in live_keys]).reshape(len(live_keys), len(BIAS_COLUMNS))
        return LiveHubnessView(live_lse, {bank: (sims.copy(), positions(idx)) for bank, (sims, idx) in self._top.items()})

    def _recompute(
        self,
        bank: str,
        rows: np.ndarray,
        base_embeddings: np.ndarray,
        base_alive: np.ndarray,
        live_keys: np.ndarray,
        live_vectors: np.ndarray,
        key_of: Callable[[str], int],
    ) -> None:
        """The top-k of `rows` over every document that exists (base in chunks, then the live segment)."""
        members = self._bank[bank][rows]
        own = np.full(len(rows), -1, dtype=np.int64)
        if bank == "gallery":
            own = np.array([key_of(self._gallery_ids[r]) for r in rows], dtype=np.int64)
        sims_top = np.full((len(rows), self._top[bank][0].shape[1]), -np.inf, dtype=np.float32)
        idx_top = np.full(sims_top.shape, -1, dtype=np.int64)
        blocks = [
            (np.arange(d0, min(d0 + _DOC_CHUNK, self.base_docs)), base_alive[d0 : d0 + _DOC_CHUNK])
            for d0 in range(0, self.base_docs, _DOC_CHUNK)
        ]
        for keys, alive in blocks + [(np.asarray(live_keys, dtype=np.int64), None)]:
            if len(keys) == 0:
                continue
            vectors = live_vectors if alive is None else np.asarray(base_embeddings[keys[0] : keys[-1] + 1], dtype=np.float32)
            sims = members @ vectors.T
            if alive is not None:
                sims[:, ~alive] = -np.inf
            sims[own[:, None] == keys[None, :]] = -np.inf
            update_top_k(sims_top, idx_top, sims, keys)
        self._top[bank][0][rows], self._top[bank][1][rows] = sims_top, idx_top


@dataclass(frozen=True)
class LiveHubnessView:
    """An immutable state for one snapshot: the live documents' biases and each member's top-k, in joint positions."""

    live_lse: np.ndarray  # (live documents, len(BIAS_COLUMNS))
    neighbours: dict[str, tuple[np.ndarray, np.ndarray]]  # bank -> (top sims, joint positions; -1: none)

    def correction(self, base: HubnessCorrection, alive: np.ndarray | None) -> HubnessCorrection:
        """The correction over the joint numbering; `alive` (bool, joint): the documents that exist (None: all)."""
        lse = self._joint_lse(base)
        n = len(lse[BIAS_COLUMNS[0]])
        return HubnessCorrection(
            base.params, lse, {bank: activation_mask(sims, idx, n) for bank, (sims, idx) in self.neighbours.items()}, alive
        )

    def _joint_lse(self, base: HubnessCorrection) -> dict[str, np.ndarray]:
        return {name: np.concatenate([base.lse[name], self.live_lse[:, i]]) for i, name in enumerate(BIAS_COLUMNS)}

    def searcher(self, base: HubnessSearcher, live_vectors: np.ndarray, alive: np.ndarray | None) -> HubnessSearcher:
        """Exact corrected search over the base's augmented index and the live documents' augmented vectors."""
        augmented_live = np.hstack([live_vectors, -self.live_lse]).astype(np.float32)
        # `base` is the stored index's searcher (indexer.store), over its FAISS DenseIndex
        return HubnessSearcher(
            self.correction(base.correction, alive), LiveDense(cast(DenseIndex, base.augmented), augmented_live), base.banks
        )

    def compacted(self, base: HubnessSearcher, alive: np.ndarray) -> tuple[HubnessCorrection, Banks]:
        """The correction and banks of the compacted base: the documents that exist (`alive`, joint), renumbered in
        order."""
        new_index = np.cumsum(alive) - 1
        neighbours = {}
        for bank, (sims, idx) in self.neighbours.items():
            kept = idx >= 0
            neighbours[bank] = (sims.copy(), np.where(kept, new_index[np.where(kept, idx, 0)], -1))
        n = int(alive.sum())
        correction = HubnessCorrection(
            base.correction.params,
            lse={name: lse[alive] for name, lse in self._joint_lse(base.correction).items()},
            activation={bank: activation_mask(sims, idx, n) for bank, (sims, idx) in neighbours.items()},
        )
        banks = base.banks
        assert banks is not None  # a live collection extends only a correction fitted with its banks
        return correction, Banks(banks.query, banks.gallery, banks.gallery_ids, neighbours)
