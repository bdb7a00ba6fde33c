"""A collection's in-memory state: its base index and the writes applied on top of it (the documents written, the
base documents deleted, each metadata field's type, the hubness state), frozen into a ReadView for searches.

It applies records that are already checked (indexer.live.validate) and logged; it takes no lock: the collection's
write lock guards it.
"""

from __future__ import annotations

import base64
from dataclasses import replace

import numpy as np

from hybrid_retrieval.indexer.chunking import decode_passages
from hybrid_retrieval.indexer.corpus import indexed_text
from hybrid_retrieval.indexer.live.validate import field_types_of, filterable_fields
from hybrid_retrieval.indexer.live.view import ReadView
from hybrid_retrieval.indexer.store import OpenIndex
from hybrid_retrieval.search.live_hubness import LiveHubness, Prepared
from hybrid_retrieval.search.live_terms import TermCoder
from hybrid_retrieval.search.segments import LiveDocument, LiveSegment

Passages = tuple[np.ndarray, np.ndarray]  # a chunked index's document: its passages' spans and vectors (decode_passages)


class LiveState:
    """The writes applied on a base index, up to sequence number `seq`."""

    def __init__(self, index: OpenIndex, seq: int):
        self.last_position = -1  # in a shard: the largest position a written document was given (kept across bases)
        # terms of the live documents (search.segments.LiveSegment), and a chunked index's passages': kept across
        # bases (they only grow), so that documents analysed on one base keep their term ids on the next
        self.vocabulary: dict[str, int] = {}
        self.passage_vocabulary: dict[str, int] = {}
        self.coder, self.passage_coder = TermCoder(self.vocabulary), TermCoder(self.passage_vocabulary)
        self.live: dict[str, LiveDocument] = {}
        self.passage_terms: dict[str, list[LiveDocument]] = {}
        self.start(index, seq)

    def start(self, index: OpenIndex, seq: int) -> None:
        """Begin on `index` as base, holding the writes up to `seq`, with nothing written on top of it yet. The
        documents written on the previous base are remembered analysed until `forget_previous`: replaying their
        writes on the new base (a compaction's) reuses their terms instead of analysing them again."""
        self.previous = self.live
        self.index, self.seq = index, seq
        self.dirty = False  # writes applied that no read view holds yet
        self.base_idx = index.doc_positions
        self.base_alive = np.ones(index.num_docs, dtype=bool)
        self.live = {}
        # the segments the last freeze made, the documents written since, and whether one of the live documents was
        # deleted or replaced since (then the next freeze rebuilds them; else it extends them)
        self.frozen: tuple[LiveSegment, LiveSegment | None] | None = None
        self.added: list[str] = []
        self.live_removed = False
        self.passage_terms = {}  # a chunked index: each live document's passages, analysed for passage BM25
        # keys of documents for the hubness state: base index, or num_docs + a serial for written ones (search.live_hubness)
        self.keys: dict[str, int] = {}
        self.next_key = index.num_docs
        fitted = index.hubness
        self.hubness = LiveHubness(fitted, index.num_docs) if fitted is not None and fitted.banks is not None else None
        # each metadata field's type, decided once: the index's, or the first write's for a field it lacks
        self.field_types = field_types_of(index.manifest.metadata)
        self.filterable = filterable_fields(index.manifest)

    def apply(self, record: dict, prepared: Prepared | None = None, added: dict | None = None) -> None:
        """Apply a checked record; `added`: the types of the metadata fields it adds (decide_types)."""
        ids = [doc["id"] for doc in record["documents"]] if record["op"] == "upsert" else record["ids"]
        removed = [key for key in map(self._remove, ids) if key is not None]
        if self.hubness is not None and removed:
            self.hubness.remove(removed)
        if record["op"] == "upsert":
            self.field_types.update(added or {})
            docs = record["documents"]
            vectors = [np.frombuffer(base64.b64decode(doc["vector"]), dtype="<f4") for doc in docs]
            dimension = self.index.dense.dimension
            passages = [decode_passages(doc["passages"], doc["text"], dimension) if "passages" in doc else None for doc in docs]
            for doc, analysed, doc_passages in zip(docs, self._analysed(docs, vectors, passages), passages, strict=True):
                if doc_passages is not None:
                    self.passage_terms[doc["id"]] = self._passage_terms(doc, *doc_passages)
                self.live[doc["id"]] = analysed
                self.added.append(doc["id"])
                self.last_position = max(self.last_position, doc.get("position", -1))
                self.keys[doc["id"]], self.next_key = self.next_key, self.next_key + 1
            if self.hubness is not None:
                prepared = prepared or self.hubness.prepare(ids, np.stack(vectors))
                self.hubness.add(np.array([self.keys[i] for i in ids], dtype=np.int64), prepared)
        self.seq = record["seq"]
        self.dirty = True

    def _analysed(self, docs: list[dict], vectors: list[np.ndarray], passages: list[Passages | None]) -> list[LiveDocument]:
        """The documents of a batch, analysed at once (search.live_terms), or as they were on the previous base."""
        previous = [self.previous.get(doc["id"]) for doc in docs]
        reused = [p is not None and (p.title, p.text) == (doc["title"], doc["text"]) for p, doc in zip(previous, docs, strict=True)]
        fresh = [doc for doc, again in zip(docs, reused, strict=True) if not again]
        texts, titles = [indexed_text(doc["title"], doc["text"]) for doc in fresh], [doc["title"] for doc in fresh]
        counts = iter(self.coder.counts(self.index.analyzer, texts, titles))
        out = []
        for doc, vector, parts, known, again in zip(docs, vectors, passages, previous, reused, strict=True):
            position, metadata = doc.get("position", -1), doc["metadata"]
            if again:
                assert known is not None
                spans, part_vectors = parts or (None, None)
                changed = {"metadata": metadata, "vector": vector, "position": position}
                out.append(replace(known, **changed, passage_spans=spans, passage_vectors=part_vectors))
            else:
                out.append(LiveDocument.of(doc["id"], doc["title"], doc["text"], metadata, next(counts), vector, position, parts))
        return out

    def forget_previous(self) -> None:
        """Drop the previous base's analysed documents (start): their writes are replayed."""
        self.previous = {}

    def _passage_terms(self, doc: dict, spans: np.ndarray, vectors: np.ndarray) -> list[LiveDocument]:
        texts = [indexed_text(doc["title"], doc["text"][start:end]) for start, end in spans.tolist()]
        counts = self.passage_coder.counts(self.index.analyzer, texts)
        return [LiveDocument.of(doc["id"], "", "", {}, c, v) for c, v in zip(counts, vectors, strict=True)]

    def _remove(self, doc_id: str) -> int | None:
        """Forget the document's current version; its key (None: it did not exist)."""
        self.passage_terms.pop(doc_id, None)
        if self.live.pop(doc_id, None) is not None:
            self.live_removed = True
            return self.keys.pop(doc_id)
        idx = self.base_idx.get(doc_id)
        if idx is None or not self.base_alive[idx]:
            return None
        self.base_alive[idx] = False
        return idx

    def key_of(self, doc_id: str) -> int:
        if doc_id in self.keys:
            return self.keys[doc_id]
        idx = self.base_idx.get(doc_id)
        return idx if idx is not None and self.base_alive[idx] else -1

    def get(self, doc_id: str) -> dict | None:
        """The latest applied version of a document."""
        live = self.live.get(doc_id)
        if live is not None:
            return {"id": live.doc_id, "title": live.title, "text": live.text, "metadata": live.metadata}
        idx = self.base_idx.get(doc_id)
        return self.index.docs.get(idx) if idx is not None and self.base_alive[idx] else None

    def freeze(self) -> ReadView:
        """The current state, as searches read it."""
        live, terms = self._segments()
        hubness = None
        if self.hubness is not None:
            hubness = self.hubness.view(
                self.index.embeddings, self.base_alive, np.array(list(self.keys.values()), dtype=np.int64), live.vectors, self.key_of
            )
        return ReadView(self.index, live, self.base_alive.copy(), self.seq, dict(self.field_types), hubness, terms)

    def _segments(self) -> tuple[LiveSegment, LiveSegment | None]:
        """The live documents' segment, and a chunked index's segment of their passages' terms: the last freeze's
        extended by the documents written since, or made anew when a live document was deleted or replaced."""
        dimension, chunked = self.index.dense.dimension, self.index.passages is not None
        if self.frozen is None or self.live_removed:
            live = LiveSegment(list(self.live.values()), dimension, self.vocabulary)
            passages = [passage for doc_id in self.live for passage in self.passage_terms[doc_id]] if chunked else []
            terms = LiveSegment(passages, dimension, self.passage_vocabulary) if chunked else None
        else:
            previous, previous_terms = self.frozen
            live = previous.extended([self.live[doc_id] for doc_id in self.added])
            terms = None
            if previous_terms is not None:
                terms = previous_terms.extended([passage for doc_id in self.added for passage in self.passage_terms[doc_id]])
        self.frozen, self.added, self.live_removed = (live, terms), [], False
        return live, terms
