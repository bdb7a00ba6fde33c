"""From a search result to the hits a caller sees: stored fields, metadata, highlights, facets.

Shared by the service and `hybrid search`, so both show the same thing. Highlights follow the spec's
`highlight` (search.spec.HighlightSpec): query terms are matched through the index's analyzer
(search.highlight), and with `semantic` a hit that no query term matches gets the sentence of its text
nearest the query, embedded with the index's model (one model run per request for all such hits).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

from hybrid_retrieval.common.errors import SpecError
from hybrid_retrieval.search import checks
from hybrid_retrieval.search.analyzer import Analyzer
from hybrid_retrieval.search.filters.columns import MetadataColumns
from hybrid_retrieval.search.highlight import Highlighter, best_sentence, split_sentences
from hybrid_retrieval.search.passages import PassageIndex
from hybrid_retrieval.search.pipeline import SearchResult
from hybrid_retrieval.search.spec import HighlightSpec

ALL_FIELDS = "*"
MAX_FACET_VALUES = 20
MAX_PASSAGES = 20  # passages a hit shows at most


class Encoder(Protocol):
    """What embeds the query and sentences for semantic highlights: models.embedder.Embedder."""

    def encode(self, texts: Sequence[str]) -> np.ndarray: ...


def score_or_none(score: float) -> float | None:
    return None if np.isnan(score) else float(score)


class Presenter:
    """Turns search results of one index into hits; created once per index, shared by requests."""

    def __init__(
        self,
        document: Callable[[int], dict[str, Any]],
        analyzer: Analyzer,
        embedder: Encoder,
        fields: Sequence[str],
        metadata: MetadataColumns | None,
        documents: Callable[[np.ndarray], list[dict[str, Any]]] | None = None,
        passages: PassageIndex | None = None,
    ) -> None:
        """`documents`, when given, reads a page's documents at once (a sharded index: one call per shard);
        `passages`: a chunked index's, whose hits can show their best passages."""
        self.embedder, self.metadata, self.passages = embedder, metadata, passages
        self.documents = documents or (lambda ids: [document(int(i)) for i in ids])
        self.highlighter = Highlighter(analyzer)
        self.fields = sorted(fields)  # every metadata field of the corpus

    def check_fields(self, fields: object, path: str = "fields") -> list[str] | str | None:
        """The metadata fields a request asks to see: a list of names, or "*" for all."""
        if fields is None or fields == ALL_FIELDS:
            return fields
        if not isinstance(fields, list) or not all(isinstance(f, str) for f in fields):
            raise SpecError(path, f'must be a list of metadata field names or "*", got {fields!r}'[:200])
        for i, name in enumerate(fields):
            if name not in self.fields:
                raise SpecError(f"{path}[{i}]", f"unknown metadata field {name!r}; fields: {', '.join(self.fields) or 'none'}")
        return fields

    def check_facets(self, facets: object, path: str = "facets") -> list[str] | None:
        if facets is None:
            return None
        if self.metadata is None:
            raise SpecError(path, "this index has no filterable metadata fields to count")
        return self.metadata.check_facets(facets, path)

    def check_passages(self, count: object, path: str = "passages") -> int:
        """How many passages each hit shows (0: none)."""
        count = checks.number(path, count, 0, MAX_PASSAGES, integer=True)
        if count and self.passages is None:
            raise SpecError(path, "this index is not chunked into passages (build it with --chunking): use 0")
        return int(count)

    def hits(
        self,
        result: SearchResult,
        query: str,
        *,
        include_text: bool = False,
        explain: bool = False,
        fields: list[str] | str | None = None,
        passages: int = 0,
        variants: list[str] | None = None,
    ) -> list[dict[str, Any]]:
        """The page's hits: id, score, rank (from 1, counting earlier pages), title; and as asked the text,
        metadata `fields`, highlights (the spec's: the query's terms and the `variants` its typos were matched to),
        the score's components and the `passages` best passages."""
        hits: list[dict[str, Any]] = []
        docs: list[dict[str, Any]] = []
        explain = explain and result.explainable
        terms = self.highlighter.query_terms(query) | frozenset(variants or ()) if result.spec.highlight.enabled else None
        page = self.documents(result.ranking.doc_idx[result.page.start : result.page.stop])
        for position, doc in zip(result.page, page):
            docs.append(doc)
            hit: dict[str, Any] = {
                "id": doc["id"],
                "score": score_or_none(result.ranking.scores[position]),  # None: a pin that was no candidate
                "rank": position + 1,
                "title": doc["title"],
            }
            if include_text:
                hit["text"] = doc["text"]
            if fields is not None:
                metadata = doc.get("metadata", {})
                hit["fields"] = dict(metadata) if fields == ALL_FIELDS else {f: metadata[f] for f in fields if f in metadata}
            if result.spec.highlight.enabled:
                hit["highlight"] = self._highlight(query, terms, doc, result.spec.highlight)
            if explain:
                hit["explain"] = result.explain(position)
            if result.groups is not None:
                hit["group"] = self._group(result, position)
            if passages:
                hit["passages"] = self._passages(int(result.ranking.doc_idx[position]), doc["text"], self._vector(query, result), passages)
            hits.append(hit)
        if result.spec.highlight.enabled and result.spec.highlight.semantic:
            self._semantic(query, result, hits, docs)
        return hits

    def _group(self, result: SearchResult, position: int) -> dict[str, Any]:
        assert result.groups is not None
        members = result.groups.members[position]
        ids = [doc["id"] for doc in self.documents(members.doc_idx)]
        hits = [{"id": i, "score": score_or_none(s)} for i, s in zip(ids, members.scores)]
        return {"value": result.groups.values[position], "hits": hits}

    def _vector(self, query: str, result: SearchResult) -> np.ndarray:
        """The query's embedding: the search's, or (a BM25 search) one model run, kept on the result."""
        if result.vector is None:
            result.vector = self.embedder.encode([query])[0]
        return result.vector

    def _passages(self, doc_idx: int, text: str, vector: np.ndarray, count: int) -> list[dict[str, Any]]:
        """The document's `count` passages nearest the query, best first: where each lies in its text, and its cosine."""
        assert self.passages is not None  # check_passages refused a count without them
        ids, scores = self.passages.nearest(doc_idx, vector, count)
        return [
            {"text": text[start:end], "start": int(start), "end": int(end), "score": float(score)}
            for (start, end), score in zip(self.passages.spans[ids], scores)
        ]

    def _highlight(self, query: str, terms: frozenset[str] | None, doc: dict[str, Any], spec: HighlightSpec) -> dict[str, Any]:
        marked = {
            "title": self.highlighter.highlight(query, doc["title"], spec.snippet_chars, 1, terms=terms),
            "text": self.highlighter.highlight(query, doc["text"], spec.snippet_chars, spec.snippets, terms=terms),
        }
        return {name: [snippet.to_dict() for snippet in snippets] for name, snippets in marked.items()}

    def _semantic(self, query: str, result: SearchResult, hits: list[dict[str, Any]], docs: list[dict[str, Any]]) -> None:
        """The sentence nearest the query for each hit without a term match: one model run for all of them. In a chunked
        index, the passage nearest the query instead: its vectors are in the index, so no model run."""
        if self.passages is not None:
            vector = self._vector(query, result)
            for hit, doc, doc_idx in zip(hits, docs, result.ranking.doc_idx[result.page.start : result.page.stop]):
                if not (hit["highlight"]["title"] or hit["highlight"]["text"]):
                    ids = self.passages.passages_of(np.array([doc_idx]))
                    spans = [(int(a), int(b)) for a, b in self.passages.spans[ids]]
                    hit["highlight"]["semantic"] = best_sentence(doc["text"], spans, self.passages.vectors[ids], vector)
            return
        todo = [
            (hit, doc["text"], split_sentences(doc["text"]))
            for hit, doc in zip(hits, docs)
            if not (hit["highlight"]["title"] or hit["highlight"]["text"])
        ]
        todo = [item for item in todo if item[2]]  # a hit without text has no sentence to show
        if not todo:
            return
        vector = result.vector if result.vector is not None else self.embedder.encode([query])[0]
        sentences = [text[s:e] for _, text, spans in todo for s, e in spans]
        vectors = np.asarray(self.embedder.encode(sentences), dtype=np.float32)
        start = 0
        for hit, text, spans in todo:
            hit["highlight"]["semantic"] = best_sentence(text, spans, vectors[start : start + len(spans)], vector)
            start += len(spans)

    def facets(self, result: SearchResult, names: list[str] | None) -> dict[str, list[dict[str, Any]]] | None:
        """Value counts of `names` over every hit the request could page through (filtered, above min_score)."""
        if not names:
            return None
        assert self.metadata is not None  # names passed check_facets, which needs metadata
        assert result.pool is not None  # every pipeline result carries its pool
        return self.metadata.facets(names, result.pool, MAX_FACET_VALUES)
