"""POST /search and /search/batch: the request, and the hits with their scores' explanation."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, field_validator

from hybrid_retrieval.app.schemas.documents import DocumentId
from hybrid_retrieval.app.schemas.shared import CONTROL_CHARS, SPACE_CHARS, Float, Int, Strict
from hybrid_retrieval.app.schemas.spec import SpecBody
from hybrid_retrieval.search.curation import MAX_CURATED, Curation, check_ids
from hybrid_retrieval.search.grouping import MAX_GROUP_SIZE
from hybrid_retrieval.search.hits import ALL_FIELDS, MAX_FACET_VALUES, MAX_PASSAGES
from hybrid_retrieval.search.pipeline import MAX_OFFSET
from hybrid_retrieval.search.spec import MAX_K
from hybrid_retrieval.search.vectors import MAX_DIMENSION

MAX_QUERY_CHARS = 2048
_CONTROL = re.compile(f"[{CONTROL_CHARS}]")
# Documented in the schema (so generated clients and fuzzers know); enforced by the validator below,
# which names the problem in plain words.
QUERY_PATTERN = f"^[^{CONTROL_CHARS}]*[^{SPACE_CHARS}{CONTROL_CHARS}][^{CONTROL_CHARS}]*$"
SPEC_FIELDS = (
    "mode",
    "depth",
    "fusion",
    "hubness",
    "rerank",
    "min_score",
    "filter",
    "highlight",
    "typo",
    "boosts",
    "boost_mode",
    "sort",
    "text_fields",
)
MAX_BATCH = 64


class GroupByBody(Strict):
    field: str = Field(description="a filterable keyword field: one hit per value (documents without it stand alone)")
    size: Int = Field(
        default=1, description="documents a group shows, its best first", json_schema_extra={"minimum": 1, "maximum": MAX_GROUP_SIZE}
    )


class SearchRequest(SpecBody):
    # the query text, its vector, or both (the vector alone drives a dense search)
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "anyOf": [{"required": ["query"]}, {"required": ["vector"]}],
            "examples": [
                {"query": "vitamin D deficiency and bone density", "k": 5},
                {"query": "statins and cancer", "k": 10, "mode": "hybrid", "fusion": {"method": "cc", "alpha": 0.6, "norm": "zscore"}},
            ],
        },
    )

    # typed without None (null is refused, as the schema says); absent, it is None
    query: str = Field(  # type: ignore[assignment]
        default=None,
        min_length=1,
        max_length=MAX_QUERY_CHARS,
        json_schema_extra={"pattern": QUERY_PATTERN},
        description="free-text query: not blank, no control characters except tab and newline; may be left out when "
        "`vector` is given and the search is dense (no reranking, no highlights)",
    )
    vector: list[Float] = Field(
        default=None,  # type: ignore[arg-type]
        min_length=1,
        max_length=MAX_DIMENSION,
        description="the query's embedding, of the collection's dimension (normalised to unit length): the dense leg uses "
        "it instead of embedding `query`; required by collections whose embedder is `none`",
    )
    k: Int = Field(default=10, description="number of results to return", json_schema_extra={"minimum": 1, "maximum": MAX_K})
    offset: Int = Field(
        default=0,
        description="hits to skip: page 2 of 10 is offset 10, k 10 (ranks 11-20 of k 20, same scores)",
        json_schema_extra={"minimum": 0, "maximum": MAX_OFFSET},
    )
    fields: list[str] | Literal["*"] | None = Field(
        default=None, description=f'metadata fields to return with each hit, or "{ALL_FIELDS}" for all'
    )
    facets: list[str] | None = Field(
        default=None,
        description=f"keyword, bool or int fields whose values to count (the top "
        f"{MAX_FACET_VALUES} per field) over every hit the request could page through: the "
        "filtered candidates",
    )
    explain: StrictBool = Field(default=False, description="return every component of each hit's score")
    include_text: StrictBool = Field(default=False, description="return each hit's text")
    passages: Int = Field(
        default=0,
        description="a collection chunked into passages: each hit's passages nearest the query, this many, best first",
        json_schema_extra={"minimum": 0, "maximum": MAX_PASSAGES},
    )
    group_by: GroupByBody | None = Field(
        default=None, description="collapse hits by a keyword field: `k` groups, each hit the best of its group, with `group.hits` of them"
    )
    pinned: list[DocumentId] | None = Field(
        default=None,
        max_length=MAX_CURATED,
        description="document ids shown first, in this order, when they exist and pass the filter (the collection's "
        "curation rules for the query add theirs after); later pages do not repeat them",
    )
    hidden: list[DocumentId] | None = Field(
        default=None, max_length=MAX_CURATED, description="document ids never returned (with the collection's rules' for the query)"
    )

    @field_validator("query")
    @classmethod
    def _not_blank(cls, value: str | None) -> str | None:
        if value is None:  # a vector alone: the pipeline checks that the search needs no text
            return value
        if not value.strip():
            raise ValueError("query must not be empty or whitespace")
        if _CONTROL.search(value):
            raise ValueError("query must not contain control characters (tab and newline are allowed)")
        return value

    def curation(self) -> Curation:
        """The pins and hidden documents this request asks for (the collection's rules are added by the route)."""
        return Curation(check_ids(self.pinned, "pinned"), check_ids(self.hidden, "hidden"))

    def spec(self) -> dict[str, Any]:
        """The partial search spec this request asks for (the fields it sets), in the spec's dict form."""
        return self.model_dump(include=set(SPEC_FIELDS), exclude_unset=True, exclude_none=True)


class Component(BaseModel):
    score: float = Field(description="raw retriever score (BM25 score or cosine)")
    rank: int | None = Field(description="rank in the retriever's top-depth list, null if outside it")
    normalized: float | None = Field(description="normalised score (cc only)")
    contribution: float = Field(description="this retriever's share of the fused score")


class RerankComponent(BaseModel):
    score: float | None = Field(description="cross-encoder logit; null for a hit below the rerank depth")
    weight: float = Field(
        description="interpolation weight: final = the logit when 1, else "
        "weight * zscore(logit) + (1 - weight) * zscore(first_stage_score) over the reranked candidates"
    )
    first_stage_rank: int = Field(description="rank before reranking, from 1")
    first_stage_score: float = Field(description="score before reranking (fused, BM25 or cosine)")


class BoostContribution(BaseModel):
    model_config = ConfigDict(extra="allow")  # the boost as asked (field, modifier, decay, filter, weight ...)
    value: float = Field(description="the boost's value of this document, before its weight")
    contribution: float = Field(description="what it adds to the score")


class Boosted(BaseModel):
    mode: Literal["sum", "product"]
    base: float = Field(description="the score before boosts: final = base + the contributions")
    boosts: list[BoostContribution]


class Explanation(BaseModel):
    final: float | None = Field(
        description="the hit's score: the reranking's (see rerank.weight) when reranked, else the fused score, plus its "
        "boosts; null for a pinned document that was no candidate"
    )
    pinned: int | None = Field(default=None, description="a curated pin: its place among the pins, from 1")
    boosted: Boosted | None = None
    rerank: RerankComponent | None = None
    fused: float | None = Field(default=None, description="hybrid: = bm25.contribution + dense.contribution")
    bm25: Component | None = None
    dense: Component | None = None


class Snippet(BaseModel):
    text: str = Field(description="HTML-safe: the field's text escaped, matched terms in <mark>, \u2026 where the field goes on")
    start: int = Field(description="where the snippet starts in the stored field (Unicode code points)")
    end: int
    matches: list[list[int]] = Field(description="[start, end] of each marked term in the stored field")
    terms: list[str] = Field(description="the analysed query terms matched")


class SemanticSentence(BaseModel):
    text: str = Field(description="the sentence, HTML-escaped")
    start: int
    end: int
    score: float = Field(description="cosine similarity of the sentence and the query")


class Passage(BaseModel):
    text: str = Field(description="the passage: the hit's text from start to end")
    start: int = Field(description="where the passage starts in the stored text (Unicode code points)")
    end: int
    score: float = Field(description="cosine similarity of the passage and the query")


class GroupMember(BaseModel):
    id: str
    score: float | None


class HitGroup(BaseModel):
    value: str | None = Field(description="the group's value of the group_by field (null: a document without it)")
    hits: list[GroupMember] = Field(description="the group's best documents, this hit first")


class HitHighlight(BaseModel):
    title: list[Snippet]
    text: list[Snippet]
    semantic: SemanticSentence | None = Field(default=None, description="with highlight.semantic, for a hit no query term matches")


class Hit(BaseModel):
    id: str
    score: float | None = Field(description="the final score; null for a pinned document that was no candidate")
    rank: int = Field(description="from 1, counting the hits of earlier pages")
    title: str
    text: str | None = None
    fields: dict[str, Any] | None = Field(default=None, description="the metadata fields asked for that the document has")
    highlight: HitHighlight | None = None
    explain: Explanation | None = None
    passages: list[Passage] | None = Field(default=None, description="with `passages`: the hit's best passages")
    group: HitGroup | None = Field(default=None, description="with `group_by`: the group this hit leads")


class FacetValue(BaseModel):
    value: str | int | bool
    count: int


class TypoVariant(BaseModel):
    term: str = Field(description="an analysed term the collection holds")
    edits: int = Field(description="its distance from the query's term (search.typo)")


class SearchResponse(BaseModel):
    query: str | None
    k: int
    offset: int
    has_more: bool = Field(description="whether hits exist after this page")
    spec: dict[str, Any] = Field(
        description="the search spec applied, in full: the index's defaults, the service's settings and "
        "this request's fields merged (mode, depth, fusion, hubness, rerank, min_score, filter, highlight, typo, boosts, "
        "boost_mode, sort, text_fields)"
    )
    reranker: str | None = Field(default=None, description="the cross-encoder, when the spec reranks")
    hits: list[Hit]
    facets: dict[str, list[FacetValue]] | None = None
    typos: dict[str, list[TypoVariant]] | None = Field(
        default=None,
        description="with `explain`: each query term the collection does not hold, and the terms the BM25 leg matched it "
        "to under `typo` (a document counts the best of them)",
    )
    timings_ms: dict[str, float] = Field(
        description="per stage: filter, bm25, embed, dense, candidates, fusion, rerank, fields (boosts' and sorts' values), "
        "boost, sort, total"
    )


class BatchRequest(Strict):
    searches: list[SearchRequest] = Field(
        ...,
        min_length=1,
        max_length=MAX_BATCH,
        description=f"up to {MAX_BATCH} searches, each a full /search request; their queries "
        "are embedded in one model run. One invalid search answers 422 naming its index "
        "(`searches[3].k`) and none is run",
    )


class BatchResponse(BaseModel):
    results: list[SearchResponse] = Field(description="one per search, in order")
    timings_ms: dict[str, float] = Field(description="total: the whole batch")
