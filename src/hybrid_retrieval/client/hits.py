"""What the framework adapters need from a hit: its text and its metadata (score, rank, title, fields, highlights)."""

from __future__ import annotations

from typing import Any

from hybrid_retrieval.client.models import Hit, SearchRequest

RETRIEVER_FIELDS = {"include_text": True, "fields": "*"}  # a retriever hands on text and metadata


def retriever_request(search: SearchRequest | dict | None, query: str) -> dict[str, Any]:
    """The search a retriever sends for `query`: its configured spec, the query, and the hit's text and fields."""
    body = search.body() if isinstance(search, SearchRequest) else dict(search or {})
    return {**body, **RETRIEVER_FIELDS, "query": query}


def hit_metadata(hit: Hit, collection: str | None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"id": hit.id, "score": hit.score, "rank": hit.rank, "title": hit.title, **(hit.fields or {})}
    if collection is not None:
        metadata["collection"] = collection
    if hit.highlight is not None:
        metadata["highlight"] = hit.highlight.model_dump(exclude_none=True)
    return metadata
