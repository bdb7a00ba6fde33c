"""Request and response bodies of the HTTP API."""

from __future__ import annotations

import re
from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator

from search.fusion import RRF, ConvexCombination, Fusion
from search.normalize import NORMALIZERS
from search.pipeline import MAX_DEPTH, MAX_K
from search.rerank import MAX_RERANK_DEPTH

MAX_QUERY_CHARS = 2048
_CONTROL_CHARS = r"\x00-\x08\x0b\x0c\x0e-\x1f\x7f"
_CONTROL = re.compile(f"[{_CONTROL_CHARS}]")
# Documented in the schema (so generated clients and fuzzers know); enforced by the validator below,
# which names the problem in plain words.
QUERY_PATTERN = f"^[^{_CONTROL_CHARS}]*[^\\s{_CONTROL_CHARS}][^{_CONTROL_CHARS}]*$"
FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RRFParams(_Strict):
    """score(d) = sum over retrievers o of w_o / (rrf_k + rank_o(d)); ranks from 1; weights = [bm25, dense]."""

    method: Literal["rrf"]
    rrf_k: FiniteFloat = Field(60.0, ge=0, le=1e6, description="RRF constant (not the number of results)")
    weights: tuple[Annotated[FiniteFloat, Field(ge=0)], Annotated[FiniteFloat, Field(ge=0)]] = Field((1.0, 1.0), description="[bm25, dense]")

    def to_domain(self) -> Fusion:
        return RRF(rrf_k=self.rrf_k, weights=tuple(self.weights))


class CCParams(_Strict):
    """score(d) = alpha * norm(cosine(d)) + (1 - alpha) * norm(bm25(d)), normalised over the candidates."""

    method: Literal["cc"]
    alpha: FiniteFloat = Field(0.5, ge=0, le=1, description="weight of the dense retriever")
    norm: Literal[tuple(NORMALIZERS)] = Field("minmax", description="minmax | zscore | tmm (theoretical min-max) | dbsf | none")

    def to_domain(self) -> Fusion:
        return ConvexCombination(alpha=self.alpha, norm=self.norm)


FusionParams = Annotated[Union[RRFParams, CCParams], Field(discriminator="method")]


class SearchRequest(_Strict):
    query: str = Field(..., min_length=1, max_length=MAX_QUERY_CHARS, json_schema_extra={"pattern": QUERY_PATTERN},
                       description="free-text query: not blank, no control characters except tab and newline")
    k: int = Field(10, ge=1, le=MAX_K, description="number of results to return")
    mode: Literal["bm25", "dense", "hybrid"] = Field("hybrid", description="retrieval mode; hybrid fuses BM25 and dense candidates")
    depth: int | None = Field(None, ge=1, le=MAX_DEPTH, description="hybrid candidates per retriever (default from the index, 100); independent of k")
    fusion: FusionParams | None = Field(None, description="hybrid fusion; default: what the index was tuned with (RRF, rrf_k = 60, if untuned)")
    hubness: Literal["none", "qbnorm", "dbnorm"] | None = Field(
        None, description="hubness correction of dense scores (QB-Norm, DBNorm); default: what the index was fitted with")
    dynamic: bool | None = Field(None, description="dynamic inverted softmax: correct only queries whose raw top-1 is in the bank's activation set")
    min_score: FiniteFloat | None = Field(None, description="drop hits whose final score is below this: the fused score, or "
                                           "after reranking the logit (weight 1) or the z-score blend (weight < 1)")
    rerank: bool | None = Field(None, description="rerank the top rerank_depth candidates with the cross-encoder; "
                                "default: the service's setting (on when a reranker is configured)")
    rerank_depth: int | None = Field(None, ge=1, le=MAX_RERANK_DEPTH,
                                     description="candidates reranked, raised to k if smaller (every returned hit is reranked); default: the service's, 50")
    rerank_weight: FiniteFloat | None = Field(None, ge=0.0, le=1.0,
                                        description="trust in the cross-encoder: 1 orders by its logit alone, lower values blend its "
                                        "z-scored logit with the z-scored first-stage score; default: the service's (the weight "
                                        "`hybrid train-reranker` tuned on held-out queries, else 1)")
    explain: bool = Field(False, description="return every component of each hit's score")
    include_text: bool = Field(False, description="return each hit's text")

    @field_validator("query")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("query must not be empty or whitespace")
        if _CONTROL.search(value):
            raise ValueError("query must not contain control characters (tab and newline are allowed)")
        return value


class Component(BaseModel):
    score: float = Field(description="raw retriever score (BM25 score or cosine)")
    rank: int | None = Field(description="rank in the retriever's top-depth list, null if outside it")
    normalized: float | None = Field(description="normalised score (cc only)")
    contribution: float = Field(description="this retriever's share of the fused score")


class RerankComponent(BaseModel):
    score: float = Field(description="cross-encoder logit")
    weight: float = Field(description="interpolation weight: final = the logit when 1, else "
                          "weight * zscore(logit) + (1 - weight) * zscore(first_stage_score) over the reranked candidates")
    first_stage_rank: int = Field(description="rank before reranking, from 1")
    first_stage_score: float = Field(description="score before reranking (fused, BM25 or cosine)")


class Explanation(BaseModel):
    final: float = Field(description="the hit's score: the reranking's (see rerank.weight) when reranked, else the fused score")
    rerank: RerankComponent | None = None
    fused: float | None = Field(None, description="hybrid: = bm25.contribution + dense.contribution")
    bm25: Component | None = None
    dense: Component | None = None


class Hit(BaseModel):
    id: str
    score: float
    rank: int
    title: str
    text: str | None = None
    explain: Explanation | None = None


class SearchResponse(BaseModel):
    query: str
    mode: str
    k: int
    fusion: dict | None = Field(None, description="the fusion applied (hybrid mode)")
    hubness: dict = Field(description="the hubness correction applied to dense scores: method and dynamic")
    rerank: dict | None = Field(None, description="the reranking applied: model, depth and weight (null: not reranked)")
    hits: list[Hit]
    timings_ms: dict[str, float] = Field(description="per stage: bm25, embed, dense, candidates, fusion, rerank, total")


class Health(BaseModel):
    status: Literal["ok"] = "ok"


class Ready(BaseModel):
    ready: bool
    documents: int | None = None
    index: str | None = None
    created_at: str | None = Field(None, description="when the served index was built")
