"""The HTTP API's bodies as typed objects: requests the client sends and responses it reads.

They mirror the server's schema (`GET /openapi.json`); tests/test_client_schema.py fails when a field or route changes
on one side only. Requests leave out what is not set, so the server's defaults apply; responses keep fields the
server adds later (extra="allow"), so an older client keeps working against a newer server.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")

    def body(self) -> dict[str, Any]:
        """The JSON body: the fields that were set, None left out."""
        return self.model_dump(exclude_none=True, by_alias=True)


class _Response(BaseModel):
    model_config = ConfigDict(extra="allow")


# --- the search spec ------------------------------------------------------------------------------------------------


class RRF(_Request):
    """Reciprocal rank fusion: score = sum over retrievers of weight / (rrf_k + rank)."""

    method: Literal["rrf"] = "rrf"
    rrf_k: float | None = None
    weights: list[float] | None = Field(None, description="[bm25, dense]")


class ConvexCombination(_Request):
    """score = alpha * norm(cosine) + (1 - alpha) * norm(bm25), normalised over the candidates."""

    method: Literal["cc"] = "cc"
    alpha: float | None = None
    norm: str | None = None


Fusion = Annotated[RRF | ConvexCombination, Field(discriminator="method")]


class Hubness(_Request):
    method: str | None = Field(None, description="none, qbnorm or dbnorm")
    dynamic: bool | None = None


class Rerank(_Request):
    enabled: bool | None = None
    depth: int | None = None
    weight: float | None = None


class Highlight(_Request):
    enabled: bool | None = None
    semantic: bool | None = None
    snippet_chars: int | None = None
    snippets: int | None = None


class PassageScoring(_Request):
    aggregation: Literal["max", "soft"] | None = None
    temperature: float | None = None
    top: int | None = None
    bm25: Literal["document", "passages"] | None = None


class Defaults(_Request):
    """The fields of a search spec that a collection's defaults may set."""

    mode: Literal["hybrid", "bm25", "dense"] | None = None
    depth: int | None = None
    fusion: Fusion | None = None
    hubness: Hubness | None = None
    rerank: Rerank | None = None
    min_score: float | None = None
    highlight: bool | Highlight | None = None
    passage_scoring: PassageScoring | None = None
    typo: Literal["auto", 0, 1, 2] | None = None
    boosts: list[dict[str, Any]] | None = Field(
        None, description='e.g. {"decay": "gauss", "field": "published", "origin": "now", "scale": "30d", "weight": 0.5}'
    )
    boost_mode: Literal["sum", "product"] | None = None
    text_fields: dict[str, float] | None = Field(None, description='BM25F weights, e.g. {"title": 3, "text": 1}')
    sort: list[str | dict[str, str]] | None = Field(None, description='e.g. ["price", {"field": "published", "order": "desc"}]')


class GroupBy(_Request):
    field: str
    size: int | None = None


class SearchRequest(Defaults):
    """One search: a query text, a vector, or both, with any field of the search spec."""

    query: str | None = None
    vector: list[float] | None = None
    k: int | None = None
    offset: int | None = None
    filter: dict[str, Any] | None = None
    fields: list[str] | Literal["*"] | None = None
    facets: list[str] | None = None
    explain: bool | None = None
    include_text: bool | None = None
    passages: int | None = None
    group_by: GroupBy | None = None
    pinned: list[str] | None = None
    hidden: list[str] | None = None


# --- search results -------------------------------------------------------------------------------------------------


class Component(_Response):
    score: float
    rank: int | None
    normalized: float | None
    contribution: float


class RerankComponent(_Response):
    score: float | None
    weight: float
    first_stage_rank: int
    first_stage_score: float


class BoostContribution(_Response):  # the boost as asked (field, modifier, decay, filter, weight ...) too
    value: float
    contribution: float


class Boosted(_Response):
    mode: Literal["sum", "product"]
    base: float
    boosts: list[BoostContribution]


class Explanation(_Response):
    final: float | None  # None: a pinned document that was no candidate
    pinned: int | None = None
    boosted: Boosted | None = None
    rerank: RerankComponent | None = None
    fused: float | None = None
    bm25: Component | None = None
    dense: Component | None = None


class Snippet(_Response):
    text: str
    start: int
    end: int
    matches: list[list[int]]
    terms: list[str]


class SemanticSentence(_Response):
    text: str
    start: int
    end: int
    score: float


class Passage(_Response):
    text: str
    start: int
    end: int
    score: float


class GroupMember(_Response):
    id: str
    score: float | None


class HitGroup(_Response):
    value: str | None
    hits: list[GroupMember]


class HitHighlight(_Response):
    title: list[Snippet]
    text: list[Snippet]
    semantic: SemanticSentence | None = None


class Hit(_Response):
    id: str
    score: float | None  # None: a pinned document that was no candidate
    rank: int
    title: str
    text: str | None = None
    fields: dict[str, Any] | None = None
    highlight: HitHighlight | None = None
    explain: Explanation | None = None
    passages: list[Passage] | None = None
    group: HitGroup | None = None


class FacetValue(_Response):
    value: str | int | bool
    count: int


class TypoVariant(_Response):
    term: str
    edits: int


class SearchResponse(_Response):
    query: str | None
    k: int
    offset: int
    has_more: bool
    spec: dict[str, Any]
    reranker: str | None = None
    hits: list[Hit]
    facets: dict[str, list[FacetValue]] | None = None
    typos: dict[str, list[TypoVariant]] | None = None
    timings_ms: dict[str, float]


class BatchResponse(_Response):
    results: list[SearchResponse]
    timings_ms: dict[str, float]


# --- documents ------------------------------------------------------------------------------------------------------


class Document(_Request):
    """A document to upsert; `vector` for collections that bring their own vectors. Any other field is a metadata
    field (as in a corpus line for `hybrid index`)."""

    model_config = ConfigDict(extra="allow")

    id: str | int
    title: str | None = None
    text: str | list[str] = ""
    metadata: dict[str, Any] | None = None
    vector: list[float] | None = None


class StoredDocument(_Response):
    id: str
    title: str
    text: str
    metadata: dict[str, Any]


class WriteResult(_Response):
    sequence: int
    documents: int
    visible: bool


class Stats(_Response):
    documents: int
    base_documents: int
    deleted_base_documents: int | None = None
    live_documents: int | None = None
    last_sequence: int | None = None
    visible_sequence: int | None = None
    writable: bool
    write_refusal: str | None = None
    temporary_bytes: int | None = None


class Task(_Response):
    id: str
    collection: str
    state: Literal["queued", "running", "succeeded", "failed", "interrupted"]
    documents_total: int
    documents_done: int
    documents_per_second: float | None = None
    last_sequence: int | None = None
    error: str | None = None
    created_at: str
    started_at: str | None = None
    finished_at: str | None = None
    seconds: float

    @property
    def finished(self) -> bool:
        return self.state in ("succeeded", "failed", "interrupted")


# --- collections, aliases, snapshots, service -------------------------------------------------------------------------


class EmbedderSettings(_Request):
    kind: Literal["model", "none"] | None = None
    dimension: int | None = None
    model: str | None = None
    profile: Literal["full", "small", "fast"] | None = None
    precision: str | None = None


class AnalyzerSettings(_Request):
    """How BM25 reads text: a `language` sets the stemmer and stop words; `stopwords` may be a list of words."""

    language: str | None = None
    stemmer: str | None = None
    stopwords: str | list[str] | None = None
    normalization: Literal["none", "nfkc"] | None = None
    fold_accents: bool | None = None
    cjk: Literal["bigram", "jieba", "sudachi", "kiwi", "none"] | None = None
    lowercase: bool | None = None


class CurationRule(_Request):
    """`CurationRule(query="iphone", pinned=["sku-15"])`: pinned first or hidden when a query matches."""

    query: str
    match: Literal["exact", "contains"] | None = None
    pinned: list[str] | None = None
    hidden: list[str] | None = None


class SynonymRule(_Request):
    """`SynonymRule(equivalent=["car", "automobile"])`, or one way: `SynonymRule(from_="heart attack", to=[...])`."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    equivalent: list[str] | None = None
    from_: str | list[str] | None = Field(None, alias="from")
    to: list[str] | None = None


class BM25Settings(_Request):
    k1: float | None = None
    b: float | None = None


class VectorSettings(_Request):
    kind: str | None = None
    exact_below: int | None = None
    nlist: int | None = None
    nprobe: int | None = None
    hnsw_m: int | None = None
    pq_m: int | None = None
    pq_refine: int | None = None
    ef_construction: int | None = None
    ef_search: int | None = None
    flat_search_cutoff: int | None = None


class ChunkingSettings(_Request):
    method: Literal["none", "tokens", "paragraphs"] | None = None
    size: int | None = None
    overlap: int | None = None


class CollectionSettings(_Request):
    """What a collection is created with; every field is optional (the server's defaults apply)."""

    embedder: EmbedderSettings | None = None
    analyzer: AnalyzerSettings | None = None
    synonyms: list[SynonymRule] | None = None
    bm25: BM25Settings | None = None
    vectors: VectorSettings | None = None
    filterable: list[str] | None = None
    chunking: ChunkingSettings | None = None
    defaults: Defaults | None = None


class CollectionSummary(_Response):
    name: str
    documents: int
    state: Literal["ready", "read-only", "failed"]
    aliases: list[str]
    error: str | None = None  # why a failed collection cannot be opened


class CollectionInfo(_Response):
    name: str
    aliases: list[str]
    documents: int
    settings: dict[str, Any]
    defaults: dict[str, Any]
    evidence: dict[str, Any]
    fusion_tuning: dict[str, Any] | None = None
    metadata: dict[str, Any]
    curation: list[dict[str, Any]] = []
    stats: Stats
    disk_bytes: int
    memory_bytes: int
    created_at: str
    index: str


class Snapshot(_Response):
    id: str
    collection: str
    sequence: int
    documents: int
    bytes: int
    created_at: str
    manifest_sha256: str
    model: Literal["included", "referenced"] = "included"  # referenced: it restores where that model is
    format: int


class Ready(_Response):
    ready: bool
    collections: int | None = None
    documents: int | None = None
    index: str | None = None
    created_at: str | None = None
    model: str | None = None
    fusion_tuning: dict[str, Any] | None = None
    defaults: dict[str, Any] | None = None
    evidence: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    writable: bool | None = None
    write_refusal: str | None = None
    failed_collections: int = 0  # collections that cannot be opened (the others serve)
    failed: dict[str, str] | None = None  # those the key may use, and why each failed
