"""What searches of a live collection read: an immutable ReadView of the base index, the documents written since
(the live segment) and the base documents deleted, with the pipeline and presenter over both segments.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hybrid_retrieval.indexer.corpus import indexed_text
from hybrid_retrieval.indexer.store import OpenIndex, best_passage_text
from hybrid_retrieval.search.filters.columns import MetadataColumns
from hybrid_retrieval.search.hits import Presenter
from hybrid_retrieval.search.live_hubness import LiveHubnessView
from hybrid_retrieval.search.passages import PassageIndex
from hybrid_retrieval.search.pipeline import SearchPipeline
from hybrid_retrieval.search.rerank import Reranker
from hybrid_retrieval.search.segments import LiveBM25, LiveDense, LiveSegment, LiveVectors, concat_columns, live_passages

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReadView:
    """What searches read: the base index, the live documents, which base documents are deleted, as of `seq`."""

    index: OpenIndex
    live: LiveSegment
    base_alive: np.ndarray  # bool (n,)
    seq: int
    field_types: dict  # each metadata field's type in the collection (None: not filterable)
    hubness: LiveHubnessView | None = None  # the fitted correction extended to the writes (None: no fit, or no banks)
    passage_terms: LiveSegment | None = None  # a chunked index: the written passages' postings, for passage BM25

    @property
    def changed(self) -> bool:
        """Whether writes changed anything searches see: documents, deletions, or a filterable field added."""
        added = any(kind and name not in self.index.manifest.metadata for name, kind in self.field_types.items())
        return len(self.live) > 0 or not bool(self.base_alive.all()) or added

    @property
    def num_docs(self) -> int:
        """Documents in the numbering (base then live), deleted base documents included."""
        return len(self.base_alive) + len(self.live)

    @property
    def documents(self) -> int:
        """Documents that exist."""
        return int(self.base_alive.sum()) + len(self.live)

    def document(self, doc_idx: int) -> dict:
        if doc_idx < len(self.base_alive):
            return self.index.docs.get(doc_idx)
        doc = self.live.docs[doc_idx - len(self.base_alive)]
        return {"id": doc.doc_id, "title": doc.title, "text": doc.text, "metadata": doc.metadata}

    def doc_text(self, doc_idx: int) -> str:
        doc = self.document(doc_idx)
        return indexed_text(doc["title"], doc["text"])

    @functools.cached_property
    def metadata(self) -> MetadataColumns | None:
        """The filterable columns over both segments, built once per view (its pipeline and presenter share them)."""
        if not self.changed:
            return self.index.metadata
        live = self.live.columns(self.field_types, self.index.manifest.metadata)
        return concat_columns(self.index.metadata, live, len(self.base_alive), len(self.live))

    @functools.cached_property
    def passages(self) -> PassageIndex | None:
        """A chunked index's passages, the written documents' included (built once per view)."""
        if self.index.passages is None:
            return None
        assert self.passage_terms is not None  # LiveState.freeze makes them for a chunked index
        return live_passages(self.index.passages, self.live, self.passage_terms, self.base_alive)

    def best_passage_text(self, doc_idx: int, vector: np.ndarray) -> str:
        assert self.passages is not None
        return best_passage_text(self.document(doc_idx), self.passages, doc_idx, vector)

    def pipeline(
        self, overrides: dict | None = None, executor=None, cross_encoder=None, cross_encoder_name: str = "", embedder=None
    ) -> SearchPipeline:
        """As OpenIndex.pipeline, over the view. An unchanged view is served by the base index as built."""
        if not self.changed:
            return self.index.pipeline(overrides, executor, cross_encoder, cross_encoder_name, embedder)
        index = self.index
        defaults = index.manifest.defaults.merge(overrides)
        alive = None if self.base_alive.all() else np.concatenate([self.base_alive, np.ones(len(self.live), bool)])
        hubness = None
        unfitted: dict[str, Any] = {}
        if self.hubness is not None:
            assert index.hubness is not None  # a live correction extends the base's
            hubness = self.hubness.searcher(index.hubness, self.live.vectors, alive)
        elif index.hubness is not None:
            if defaults.hubness.method != "none":
                logger.warning("hubness correction is not applied to the written documents: the fit has no banks")
                defaults = defaults.merge({"hubness": {"method": "none"}})
            unfitted = {
                "no_hubness_reason": (
                    "this index's hubness correction was fitted before fits kept their banks, so it cannot be extended to "
                    "written documents: refit it with `hybrid hubness fit`"
                )
            }
        reranker = None
        if cross_encoder is not None:
            passage_text = self.best_passage_text if self.passages is not None else None
            reranker = Reranker(cross_encoder, self.doc_text, cross_encoder_name, passage_text_of=passage_text)
        return SearchPipeline(
            LiveBM25(index.bm25, index.postings, index.manifest.bm25, self.base_alive, self.live),
            LiveDense(index.dense, self.live.vectors),
            embedder or index.query_embedder,
            LiveVectors(index.embeddings, self.live.vectors),
            defaults=defaults,
            executor=executor,
            hubness=hubness,
            reranker=reranker,
            metadata=self.metadata,
            alive=alive,
            passages=self.passages,
            positions_of=self.positions_of,
            **unfitted,
        )

    @functools.cached_property
    def _live_positions(self) -> dict[str, int]:
        base = len(self.base_alive)
        return {doc.doc_id: base + i for i, doc in enumerate(self.live.docs)}

    def positions_of(self, ids: Sequence[str]) -> list[int | None]:
        """Each document's position in the view (None: no such document, or deleted)."""
        found: list[int | None] = []
        for doc_id in ids:
            position = self.index.doc_positions.get(doc_id)
            if position is None or not self.base_alive[position]:
                position = self._live_positions.get(doc_id)
            found.append(position)
        return found

    def presenter(self, embedder=None) -> Presenter:
        fields = set(self.index.manifest.metadata) | self.live.fields
        return Presenter(
            self.document, self.index.analyzer, embedder or self.index.embedder, sorted(fields), self.metadata, passages=self.passages
        )
