"""GET /health and /ready (also what POST /admin/reload answers)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field


class Health(BaseModel):
    status: Literal["ok"] = "ok"


class Ready(BaseModel):
    ready: bool
    collections: int | None = Field(default=None, description="collections served (the fields below describe the default one)")
    documents: int | None = None
    index: str | None = None
    created_at: str | None = Field(default=None, description="when the served index was built")
    model: str | None = Field(default=None, description="the embedding model the index was built with")
    fusion_tuning: dict[str, Any] | None = Field(
        default=None, description="what `hybrid tune` measured when it chose the default fusion: metric, value, queries, qrels, when"
    )
    defaults: dict[str, Any] | None = Field(
        default=None,
        description="the search spec a request that sets nothing gets: the index's defaults with the service's settings merged on",
    )
    evidence: dict[str, Any] | None = Field(
        default=None,
        description="what each fitted default rests on (fusion, hubness, rerank): the metric, "
        "the held-out queries and split, the values compared and the decision",
    )
    metadata: dict[str, Any] | None = Field(
        default=None,
        description="the corpus's metadata fields: type (keyword, bool, int, float, date) "
        "when filterable, documents with a value, distinct values (keyword), or why not filterable",
    )
    writable: bool | None = Field(default=None, description="whether writes can be taken now (GET /stats says why not)")
    write_refusal: str | None = None
    failed_collections: int = Field(default=0, description="collections of the data directory that cannot be opened (the others serve)")
    failed: dict[str, str] | None = Field(
        default=None, description="those of them the presented key may use (every one when the service has no keys), and why each failed"
    )
