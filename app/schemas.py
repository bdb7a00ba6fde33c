"""Request and response bodies of the HTTP API."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from search.pipeline import MAX_DEPTH, MAX_K

MAX_QUERY_CHARS = 2048


class SearchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    query: str = Field(..., min_length=1, max_length=MAX_QUERY_CHARS, description="free-text query")
    k: int = Field(10, ge=1, le=MAX_K, description="number of results to return")
    mode: Literal["bm25", "dense", "hybrid"] = Field(
        "hybrid",
        description="bm25, dense, or hybrid: Reciprocal Rank Fusion, score(d) = sum_o 1/(rrf_k + rank_o(d)), "
        "ranks from 1, rrf_k = 60, over the top-`depth` candidates of each retriever",
    )
    depth: int | None = Field(None, ge=1, le=MAX_DEPTH, description="hybrid candidates per retriever (default 100); independent of k")
    include_text: bool = Field(False, description="return each hit's text")

    @field_validator("query")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("query must not be empty or whitespace")
        return value


class Hit(BaseModel):
    id: str
    score: float
    rank: int
    title: str
    text: str | None = None


class SearchResponse(BaseModel):
    query: str
    mode: str
    k: int
    hits: list[Hit]
    timings_ms: dict[str, float] = Field(description="per stage: embed, dense, bm25, fusion, total")


class Health(BaseModel):
    status: Literal["ok"] = "ok"


class Ready(BaseModel):
    ready: bool
    documents: int | None = None
    index: str | None = None
