"""What the framework adapters need from a hit: its text (or best passages) and its metadata (score, rank, title, fields,
highlights, passages)."""

from __future__ import annotations

from typing import Any

from hybrid_retrieval.client.models import Hit, SearchRequest

RETRIEVER_FIELDS = {"include_text": True, "fields": "*"}  # a retriever hands on text and metadata


def retriever_request(search: SearchRequest | dict | None, query: str) -> dict[str, Any]:
    """The search a retriever sends for `query`: its configured spec, the query, and the hit's text and fields."""
    body = search.body() if isinstance(search, SearchRequest) else dict(search or {})
    return {**body, **RETRIEVER_FIELDS, "query": query}


def hit_text(hit: Hit) -> str:
    """The text a framework hands on: a chunked collection's best passages of the hit when the search asked for
    `passages` (the context a RAG prompt wants), else the hit's whole text."""
    if hit.passages:
        return "\n\n".join(passage.text for passage in hit.passages)
    return hit.text or ""


def hit_metadata(hit: Hit, collection: str | None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"id": hit.id, "score": hit.score, "rank": hit.rank, "title": hit.title, **(hit.fields or {})}
    if collection is not None:
        metadata["collection"] = collection
    if hit.highlight is not None:
        metadata["highlight"] = hit.highlight.model_dump(exclude_none=True)
    if hit.passages:  # where each passage of the text handed on lies in the document, and its cosine
        metadata["passages"] = [{"start": p.start, "end": p.end, "score": p.score} for p in hit.passages]
    return metadata
