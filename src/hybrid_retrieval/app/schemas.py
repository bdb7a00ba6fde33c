"""Request and response bodies of the HTTP API."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, StrictInt, field_validator

from hybrid_retrieval.common.names import NAME_RULE, NAME_RULE_TEXT
from hybrid_retrieval.indexer.chunking import CHUNKING_METHODS
from hybrid_retrieval.models.onnx_export import PRECISIONS
from hybrid_retrieval.models.profiles import PROFILES
from hybrid_retrieval.models.registry import DEFAULT_MODEL
from hybrid_retrieval.search.analyzer import LANGUAGES, NORMALIZATIONS, STEMMERS, STOPWORD_LISTS
from hybrid_retrieval.search.cjk import CJK_MODES
from hybrid_retrieval.search.dense import EXACT_BELOW, FAISS_KINDS
from hybrid_retrieval.search.filters.language import MAX_FILTER_DEPTH, MAX_LIST_VALUES, OPERATORS
from hybrid_retrieval.search.fusion import MAX_RRF_K, MAX_RRF_WEIGHT
from hybrid_retrieval.search.grouping import MAX_GROUP_SIZE
from hybrid_retrieval.search.highlight import SNIPPET_CHARS_RANGE, SNIPPETS_RANGE
from hybrid_retrieval.search.hits import ALL_FIELDS, MAX_FACET_VALUES, MAX_PASSAGES
from hybrid_retrieval.search.hubness import HUBNESS_METHODS
from hybrid_retrieval.search.normalize import NORMALIZERS
from hybrid_retrieval.search.pipeline import MAX_OFFSET
from hybrid_retrieval.search.rerank import MAX_RERANK_DEPTH
from hybrid_retrieval.search.spec import AGGREGATIONS, BM25_UNITS, MAX_DEPTH, MAX_K, MODES
from hybrid_retrieval.search.vectors import MAX_DIMENSION

MAX_QUERY_CHARS = 2048
_CONTROL_CHARS = r"\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f"  # C0 and C1 controls, except tab, newline, carriage return
# Python's str.isspace outside the controls, spelled out: JSON Schema's \s (ECMAScript) differs (U+FEFF, U+0085)
_SPACE_CHARS = r"\t\n\r \xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
_CONTROL = re.compile(f"[{_CONTROL_CHARS}]")
# Documented in the schema (so generated clients and fuzzers know); enforced by the validator below,
# which names the problem in plain words.
QUERY_PATTERN = f"^[^{_CONTROL_CHARS}]*[^{_SPACE_CHARS}{_CONTROL_CHARS}][^{_CONTROL_CHARS}]*$"
DOC_ID_PATTERN = f"[^{_SPACE_CHARS}{_CONTROL_CHARS}]"  # holds a character that is neither space nor control
# The search spec's fields are typed here and validated by search.spec alone (one set of rules for the API,
# the manifest and the CLI); the ranges and choices below only document them, from the same constants.
SPEC_FIELDS = ("mode", "depth", "fusion", "hubness", "rerank", "min_score", "filter", "highlight")
MAX_BATCH = 64
FILTER_DESCRIPTION = f"""Which documents may be retrieved, applied inside both retrievers before their top-`depth` is cut
(so up to `k` hits come back whenever `k` documents match). A JSON object whose fields are ANDed:
`FIELD: VALUE` (equality), `FIELD: {{OP: VALUE, ...}}` with OP one of {", ".join(OPERATORS)} (a leading `$` is
accepted, as in MongoDB), and `"$and": [FILTER, ...]`, `"$or": [FILTER, ...]`, `"$not": FILTER`. Fields are the
index's filterable metadata fields (`GET /ready` lists them with their types: keyword, bool, int, float, date).
Keyword fields may hold lists (a condition holds when any value satisfies it); dates are ISO-8601 strings;
ranges apply to int, float, date and keyword fields. `ne` and `nin` also match documents without the field,
the other operators need it; `{{"exists": false}}` matches documents without it. At most {MAX_FILTER_DEPTH}
levels of nesting and {MAX_LIST_VALUES} values per list. An unknown field, a value of the wrong type or an
unknown operator answers 422 naming its path, e.g. `filter.year.gte`."""
FILTER_EXAMPLES = [
    {"year": {"gte": 2015}, "journal": {"in": ["Nature", "Cell"]}, "open_access": True},
    {"$or": [{"tags": "oncology"}, {"published": {"gte": "2020-01-01", "lt": "2021-01-01"}}], "$not": {"journal": "Cell"}},
]


def _documented(description: str, **schema) -> dict:
    return {"default": None, "description": description, "json_schema_extra": schema}


def _json_number(value):
    if isinstance(value, bool):
        raise ValueError("must be a number, not true or false")
    if isinstance(value, str):
        raise ValueError("must be a number, not a string")
    return value


# JSON types as sent (StrictBool for flags): no "yes" -> true, "8" -> 8, 1 -> true or true -> 1 (an integral 1.0 is an
# integer in JSON Schema)
Int = Annotated[int, BeforeValidator(_json_number)]
Float = Annotated[float, BeforeValidator(_json_number)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RRFBody(_Strict):
    """score(d) = sum over retrievers o of w_o / (rrf_k + rank_o(d)), ranks from 1, weights [bm25, dense].
    Fields not given come from the index's default fusion when it is RRF too, else RRF's defaults."""

    method: Literal["rrf"]
    rrf_k: Float | None = Field(**_documented("the RRF constant (not the number of results)", minimum=0, maximum=MAX_RRF_K))
    weights: list[Float] | None = Field(
        **_documented(
            f"[bm25, dense], each from 0 to {MAX_RRF_WEIGHT:g}", minItems=2, maxItems=2, items={"minimum": 0, "maximum": MAX_RRF_WEIGHT}
        )
    )


class CCBody(_Strict):
    """score(d) = alpha * norm(cosine(d)) + (1 - alpha) * norm(bm25(d)), normalised over the candidates.
    Fields not given come from the index's default fusion when it is cc too, else cc's defaults."""

    method: Literal["cc"]
    alpha: Float | None = Field(**_documented("weight of the dense retriever", minimum=0, maximum=1))
    norm: str | None = Field(**_documented("per-query normalisation", enum=list(NORMALIZERS)))


FusionBody = Annotated[RRFBody | CCBody, Field(discriminator="method")]


class HubnessBody(_Strict):
    method: str | None = Field(
        **_documented("hubness correction of dense scores (QB-Norm, DBNorm); default: the index's", enum=list(HUBNESS_METHODS))
    )
    dynamic: StrictBool | None = Field(
        None, description="dynamic inverted softmax: correct only queries whose raw top-1 is in the bank's activation set"
    )


class RerankBody(_Strict):
    enabled: StrictBool | None = Field(
        None, description="rerank with the cross-encoder; default: the service's setting (on when a reranker is configured)"
    )
    depth: Int | None = Field(
        **_documented(
            "first-stage hits reranked; hits below it follow in first-stage order, "
            "scores shifted under the reranked ones; default: the service's, 50",
            minimum=1,
            maximum=MAX_RERANK_DEPTH,
        )
    )
    weight: Float | None = Field(
        **_documented(
            "trust in the cross-encoder: 1 orders by its logit alone, lower values blend its "
            "z-scored logit with the z-scored first-stage score; default: the service's (the "
            "weight `hybrid train-reranker` tuned on held-out queries, else 1)",
            minimum=0,
            maximum=1,
        )
    )


class PassageScoringBody(_Strict):
    aggregation: str | None = Field(
        **_documented("a chunked index: a document scores as its best passage (max) or a soft maximum of its best", enum=list(AGGREGATIONS))
    )
    temperature: Float | None = Field(**_documented("soft: τ in τ·log Σ exp(s/τ) (default 0.05)", exclusiveMinimum=0, maximum=10))
    top: Int | None = Field(**_documented("soft: the passages of a document that count (default 3)", minimum=1, maximum=100))
    bm25: str | None = Field(
        **_documented("the BM25 leg scores the whole document, or its best passage (default document)", enum=list(BM25_UNITS))
    )


class HighlightBody(_Strict):
    enabled: StrictBool | None = Field(None, description="highlight the hits (default true when this object is given)")
    semantic: StrictBool | None = Field(
        None,
        description="for a hit that no query term matches (a purely dense match), also "
        "the sentence of its text nearest the query, by the served embedding model: one "
        "extra model run per request over those hits' sentences (see docs/BENCHMARKS.md)",
    )
    snippet_chars: Int | None = Field(
        **_documented(
            "about how many characters a snippet has (default 160)", minimum=SNIPPET_CHARS_RANGE[0], maximum=SNIPPET_CHARS_RANGE[1]
        )
    )
    snippets: Int | None = Field(
        **_documented(
            "at most this many snippets of the text, best first (default 1)", minimum=SNIPPETS_RANGE[0], maximum=SNIPPETS_RANGE[1]
        )
    )


class DefaultsBody(_Strict):
    """The fields of a search spec that a collection's defaults may set (search.spec validates them)."""

    mode: str | None = Field(
        **_documented("retrieval mode; hybrid fuses BM25 and dense candidates; default: the index's (hybrid)", enum=list(MODES))
    )
    depth: Int | None = Field(
        **_documented("hybrid candidates per retriever (default from the index, 100); independent of k", minimum=1, maximum=MAX_DEPTH)
    )
    fusion: FusionBody | None = Field(
        None, description="hybrid fusion; default: what the index was tuned with (equal-weight z-scores if untuned)"
    )
    hubness: HubnessBody | None = Field(None, description="hubness correction of dense scores; default: what the index was fitted with")
    rerank: RerankBody | None = Field(None, description="cross-encoder reranking of the first stage's top hits")
    min_score: Float | None = Field(
        None,
        description="drop hits whose final score is below this: the fused score, or "
        "after reranking the logit (weight 1) or the z-score blend (weight < 1)",
    )
    highlight: StrictBool | HighlightBody | None = Field(
        None,
        description="mark the query's terms in snippets of each hit's title and text: matched through the index's "
        "analyzer (so `bleeding` marks `bleeds`), HTML-escaped with <mark> tags, with character offsets (Unicode code "
        "points) into the stored field; `true` or an object",
    )
    passage_scoring: PassageScoringBody | None = Field(
        None, description="a chunked index: how a document scores from its passages in the dense leg (default: its best passage)"
    )


class SpecBody(DefaultsBody):
    filter: dict[str, Any] | None = Field(None, description=FILTER_DESCRIPTION, json_schema_extra={"examples": FILTER_EXAMPLES})


class GroupByBody(_Strict):
    field: str = Field(description="a filterable keyword field: one hit per value (documents without it stand alone)")
    size: Int = Field(1, description="documents a group shows, its best first", json_schema_extra={"minimum": 1, "maximum": MAX_GROUP_SIZE})


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
        None,
        min_length=1,
        max_length=MAX_QUERY_CHARS,
        json_schema_extra={"pattern": QUERY_PATTERN},
        description="free-text query: not blank, no control characters except tab and newline; may be left out when "
        "`vector` is given and the search is dense (no reranking, no highlights)",
    )
    vector: list[Float] = Field(  # type: ignore[assignment]
        None,
        min_length=1,
        max_length=MAX_DIMENSION,
        description="the query's embedding, of the collection's dimension (normalised to unit length): the dense leg uses "
        "it instead of embedding `query`; required by collections whose embedder is `none`",
    )
    k: Int = Field(10, description="number of results to return", json_schema_extra={"minimum": 1, "maximum": MAX_K})
    offset: Int = Field(
        0,
        description="hits to skip: page 2 of 10 is offset 10, k 10 (ranks 11-20 of k 20, same scores)",
        json_schema_extra={"minimum": 0, "maximum": MAX_OFFSET},
    )
    fields: list[str] | Literal["*"] | None = Field(None, description=f'metadata fields to return with each hit, or "{ALL_FIELDS}" for all')
    facets: list[str] | None = Field(
        None,
        description=f"keyword, bool or int fields whose values to count (the top "
        f"{MAX_FACET_VALUES} per field) over every hit the request could page through: the "
        "filtered candidates",
    )
    explain: StrictBool = Field(False, description="return every component of each hit's score")
    include_text: StrictBool = Field(False, description="return each hit's text")
    passages: Int = Field(
        0,
        description="a collection chunked into passages: each hit's passages nearest the query, this many, best first",
        json_schema_extra={"minimum": 0, "maximum": MAX_PASSAGES},
    )
    group_by: GroupByBody | None = Field(
        None, description="collapse hits by a keyword field: `k` groups, each hit the best of its group, with `group.hits` of them"
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

    def spec(self) -> dict:
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


class Explanation(BaseModel):
    final: float = Field(description="the hit's score: the reranking's (see rerank.weight) when reranked, else the fused score")
    rerank: RerankComponent | None = None
    fused: float | None = Field(None, description="hybrid: = bm25.contribution + dense.contribution")
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
    score: float


class HitGroup(BaseModel):
    value: str | None = Field(description="the group's value of the group_by field (null: a document without it)")
    hits: list[GroupMember] = Field(description="the group's best documents, this hit first")


class HitHighlight(BaseModel):
    title: list[Snippet]
    text: list[Snippet]
    semantic: SemanticSentence | None = Field(None, description="with highlight.semantic, for a hit no query term matches")


class Hit(BaseModel):
    id: str
    score: float
    rank: int = Field(description="from 1, counting the hits of earlier pages")
    title: str
    text: str | None = None
    fields: dict[str, Any] | None = Field(None, description="the metadata fields asked for that the document has")
    highlight: HitHighlight | None = None
    explain: Explanation | None = None
    passages: list[Passage] | None = Field(None, description="with `passages`: the hit's best passages")
    group: HitGroup | None = Field(None, description="with `group_by`: the group this hit leads")


class FacetValue(BaseModel):
    value: str | int | bool
    count: int


class SearchResponse(BaseModel):
    query: str | None
    k: int
    offset: int
    has_more: bool = Field(description="whether hits exist after this page")
    spec: dict = Field(
        description="the search spec applied, in full: the index's defaults, the service's settings and "
        "this request's fields merged (mode, depth, fusion, hubness, rerank, min_score, filter, highlight)"
    )
    reranker: str | None = Field(None, description="the cross-encoder, when the spec reranks")
    hits: list[Hit]
    facets: dict[str, list[FacetValue]] | None = None
    timings_ms: dict[str, float] = Field(description="per stage: filter, bm25, embed, dense, candidates, fusion, rerank, total")


class BatchRequest(_Strict):
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


class Health(BaseModel):
    status: Literal["ok"] = "ok"


class Ready(BaseModel):
    ready: bool
    collections: int | None = Field(None, description="collections served (the fields below describe the default one)")
    documents: int | None = None
    index: str | None = None
    created_at: str | None = Field(None, description="when the served index was built")
    model: str | None = Field(None, description="the embedding model the index was built with")
    fusion_tuning: dict | None = Field(
        None, description="what `hybrid tune` measured when it chose the default fusion: metric, value, queries, qrels, when"
    )
    defaults: dict | None = Field(
        None, description="the search spec a request that sets nothing gets: the index's defaults with the service's settings merged on"
    )
    evidence: dict | None = Field(
        None,
        description="what each fitted default rests on (fusion, hubness, rerank): the metric, "
        "the held-out queries and split, the values compared and the decision",
    )
    metadata: dict | None = Field(
        None,
        description="the corpus's metadata fields: type (keyword, bool, int, float, date) "
        "when filterable, documents with a value, distinct values (keyword), or why not filterable",
    )
    writable: bool | None = Field(None, description="whether writes can be taken now (GET /stats says why not)")
    write_refusal: str | None = None
    failed_collections: int = Field(0, description="collections of the data directory that cannot be opened (the others serve)")
    failed: dict[str, str] | None = Field(
        None, description="those of them the presented key may use (every one when the service has no keys), and why each failed"
    )


class DocumentIn(BaseModel):
    """The format `hybrid index` reads a corpus line in too: any other field is a metadata field (over the `metadata`
    object's field of that name), and `_id` may stand for `id`."""

    model_config = ConfigDict(
        extra="allow",
        json_schema_extra={
            "examples": [
                {"id": "n1", "title": "Quokkas", "text": "The quokka is a small marsupial.", "metadata": {"year": 2024}},
                {"_id": "n2", "title": "Falcons", "text": "Falcons dive fast.", "year": 2023, "tags": ["birds"]},
            ]
        },
    )

    id: str | int = Field(
        description="unique id (or `_id`, as in a BEIR corpus), at most 512 bytes of UTF-8, no control characters, not . "
        "or ..; an existing id is replaced. `/documents/{id}` takes it percent-encoded (a/b as a%2Fb)"
    )
    title: str | None = None
    text: str | list[str] = Field(
        description="the body (may be empty when the title is not), or its paragraphs as a list (stored joined by a blank line)"
    )
    metadata: dict[str, Any] | None = Field(
        None,
        description="strings, numbers, true/false, lists of strings, ISO-8601 dates; "
        "a field keeps the type the index or its first write gave it (another "
        "type answers 422)",
    )
    vector: list[Float] | None = Field(
        None,
        description="the document's embedding, of the collection's dimension (normalised to unit length): stored instead "
        "of embedding its text; required by collections whose embedder is `none`",
    )


class DocumentBatch(BaseModel):
    documents: list[DocumentIn] = Field(description="upserted all or nothing; at most HYBRID_MAX_BATCH_DOCS (1,000)")


DocumentId = Annotated[str, Field(min_length=1, max_length=512, pattern=r"\S", description="at most 512 bytes of UTF-8")]


class DeleteRequest(_Strict):
    ids: list[DocumentId | StrictInt] = Field(  # an integer id too, as a document may have been written with
        ..., min_length=1, description="documents to delete (an id that does not exist is no error)", examples=[["n1", "n2"]]
    )


class DocumentOut(BaseModel):
    id: str
    title: str
    text: str
    metadata: dict[str, Any]


class WriteResult(BaseModel):
    sequence: int = Field(description="the write's sequence number: durable in the write-ahead log when answered")
    documents: int = Field(description="documents in the write")
    visible: bool = Field(description="whether searches see it yet (always true with ?wait=true)")


class Stats(BaseModel):
    documents: int = Field(description="documents that exist now (searchable)")
    base_documents: int = Field(description="documents of the built index (the base segment), deleted ones included")
    deleted_base_documents: int | None = None
    live_documents: int | None = Field(None, description="documents written since the build (the live segment)")
    last_sequence: int | None = Field(None, description="the last acknowledged write")
    visible_sequence: int | None = Field(None, description="the last write searches see")
    writable: bool = Field(description="whether writes can be taken now")
    write_refusal: str | None = Field(
        None,
        description="why not: this index takes no writes, its folder is read-only, "
        "or the last write failed (the disk was full); cleared by the next write that succeeds",
    )
    temporary_bytes: int | None = Field(
        None,
        description="disk used beside the index by builds and compactions in progress (or left by a killed one: removed at the next start)",
    )


SETTINGS_EXAMPLE = {
    "embedder": {"model": "all-MiniLM-L6-v2"},
    "analyzer": {"language": "english"},
    "synonyms": [{"equivalent": ["laptop", "notebook"]}],
    "bm25": {"k1": 1.2, "b": 0.75},
    "vectors": {"kind": "flat"},
    "filterable": ["year", "tags"],
    "defaults": {"mode": "hybrid", "fusion": {"method": "rrf", "rrf_k": 60}},
}


class EmbedderSettings(_Strict):
    kind: Literal["model", "none"] = Field(
        "model", description="none: the collection embeds nothing; documents and dense searches bring their own `vector`"
    )
    dimension: Int | None = Field(None, ge=1, le=MAX_DIMENSION, description="with kind none (required): numbers in every vector")
    model: str = Field(
        DEFAULT_MODEL,
        min_length=1,
        description="a sentence-transformers model name or folder the server has (exported to ONNX once; the bundled "
        "all-MiniLM-L6-v2 needs nothing), or an ONNX export folder",
    )
    profile: Literal[tuple(PROFILES)] = Field(  # type: ignore[valid-type]
        "full",
        description="full: the model itself; small: a student `hybrid distil` made from it, given as the model; "
        "fast: a static model distilled from it (fp32 only)",
    )
    precision: Literal[tuple(PRECISIONS)] = Field("fp32", description="the ONNX weights that embed the documents")  # type: ignore[valid-type]


class AnalyzerSettings(_Strict):
    language: str | None = Field(
        None,
        description="sets the stemmer and stop words (and for chinese, japanese, korean: neither): "
        f"{', '.join(LANGUAGES)}, or an ISO 639-1 code",
        examples=["german", "ja"],
    )
    stemmer: Literal[STEMMERS] | None = Field(None, description="a Snowball stemmer; default: the language's (porter for English)")  # type: ignore[valid-type]
    stopwords: Literal[STOPWORD_LISTS] | list[Annotated[str, Field(min_length=1)]] | None = Field(  # type: ignore[valid-type]
        None, description="a named list (en: Lucene's short English one), none, or a list of words; default: the language's, or en"
    )
    normalization: Literal[NORMALIZATIONS] | None = Field(
        None, description="nfkc: full-width and compatibility forms folded (default none)"
    )  # type: ignore[valid-type]
    fold_accents: StrictBool | None = Field(None, description="café matches cafe (default false)")
    cjk: Literal[CJK_MODES] | None = Field(  # type: ignore[valid-type]
        None,
        description="Chinese, Japanese and Korean runs: bigram (default, no dictionary), jieba, sudachi or kiwi (dictionary "
        "segmenters, extras zh, ja, ko), none (a run is one word)",
    )
    lowercase: StrictBool | None = Field(None, description="default true")


class SynonymRule(_Strict):
    """{"equivalent": [phrases]}: each brings the others; {"from": phrase(s), "to": [phrases]}: one way."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    equivalent: list[str] | None = None
    from_: str | list[str] | None = Field(None, alias="from")
    to: list[str] | None = None


SYNONYMS_DESCRIPTION = (
    "query-time synonym rules of the lexical leg, each phrase analysed like the documents; a query holding a rule's "
    "phrase also searches its other phrases"
)


class BM25Settings(_Strict):
    k1: Float = Field(1.5, ge=0, le=1e6)
    b: Float = Field(0.75, ge=0, le=1)


class VectorSettings(_Strict):
    kind: Literal[FAISS_KINDS] = Field("flat", description="the vector index once the collection holds `exact_below` documents")
    exact_below: Int = Field(EXACT_BELOW, ge=0, description="below this many documents the vector index is exact (Flat)")
    nlist: Int | None = Field(None, ge=1, description="ivf, ivfpq: clusters (default ~4*sqrt(n))")
    nprobe: Int = Field(16, ge=1, le=65536, description="ivf, ivfpq: clusters visited per query")
    hnsw_m: Int = Field(32, ge=2, le=256, description="hnsw: links per node")
    pq_m: Int = Field(48, ge=1, le=1024, description="ivfpq: bytes a vector (must divide the dimension)")
    pq_refine: Int = Field(4, ge=1, le=64, description="ivfpq: candidates rescored exactly per result")
    ef_construction: Int = Field(200, ge=1, le=65536)
    ef_search: Int = Field(128, ge=1, le=65536)
    flat_search_cutoff: Int = Field(10_000, ge=0, description="ivf, hnsw: filters admitting at most this many documents are scored exactly")


class ChunkingSettings(_Strict):
    method: str | None = Field(**_documented("cut documents into passages for the dense leg (default none)", enum=list(CHUNKING_METHODS)))
    size: Int | None = Field(**_documented("word pieces of the model per passage (default 128)", minimum=8))
    overlap: Int | None = Field(**_documented("tokens: word pieces a passage repeats of the previous one (default 16)", minimum=0))


class CollectionSettingsBody(_Strict):
    embedder: EmbedderSettings | None = None
    analyzer: AnalyzerSettings | None = None
    synonyms: list[SynonymRule] | None = Field(None, description=SYNONYMS_DESCRIPTION + " (PATCH .../settings changes them)")
    bm25: BM25Settings | None = None
    vectors: VectorSettings | None = None
    filterable: list[Annotated[str, Field(min_length=1)]] | None = Field(
        None, description="metadata fields indexed for filters; null: every field whose values share a type"
    )
    chunking: ChunkingSettings | None = Field(None, description="passages for long documents (the dense leg ranks by its best)")
    defaults: DefaultsBody | None = Field(None, description="the search spec a request that says nothing gets")


class CollectionCreate(_Strict):
    name: str = Field(description=NAME_RULE_TEXT, pattern=f"^{NAME_RULE.pattern}$", examples=["products-v1"])
    settings: CollectionSettingsBody | None = Field(
        None, description="every field is optional: what is absent takes `hybrid index`'s default", examples=[SETTINGS_EXAMPLE]
    )

    def settings_dict(self) -> dict | None:
        return self.settings.model_dump(exclude_unset=True, exclude_none=True, by_alias=True) if self.settings is not None else None


class SettingsPatch(_Strict):
    defaults: DefaultsBody | None = Field(
        None,
        description="fields of the search spec a request that says nothing gets; each replaces that field (over the "
        "server's HYBRID_DEPTH / HYBRID_RERANK_* settings too)",
        examples=[{"mode": "hybrid", "rerank": {"enabled": False}}],
    )
    synonyms: list[SynonymRule] | None = Field(
        None,
        description=SYNONYMS_DESCRIPTION + "; replaces the collection's rules whole ([] removes them), served at once",
        examples=[[{"equivalent": ["car", "automobile"]}, {"from": "heart attack", "to": ["myocardial infarction"]}]],
    )

    def defaults_dict(self) -> dict:
        return self.defaults.model_dump(exclude_unset=True, exclude_none=True) if self.defaults is not None else {}

    def synonyms_list(self) -> list[dict] | None:
        if self.synonyms is None:
            return None
        return [rule.model_dump(exclude_none=True, by_alias=True) for rule in self.synonyms]


class CollectionSummary(BaseModel):
    name: str
    documents: int
    state: Literal["ready", "read-only", "failed"] = Field(
        description="read-only: it takes no writes now (GET /collections/{name} says why); failed: its folder cannot be opened "
        "(`error` says why; the other collections serve)"
    )
    aliases: list[str] = Field(description="aliases that point to it")
    error: str | None = Field(None, description="why a failed collection cannot be opened, and how to repair it")


class CollectionList(BaseModel):
    collections: list[CollectionSummary]


class CollectionInfo(BaseModel):
    name: str
    aliases: list[str]
    documents: int
    settings: dict[str, Any] = Field(description="what it was created with: embedder, analyzer, bm25, vectors, filterable")
    defaults: dict[str, Any] = Field(description="the search spec a request that says nothing gets")
    evidence: dict[str, Any] = Field(description="what each fitted default rests on (tuning, hubness fit, reranker weight)")
    fusion_tuning: dict | None = Field(None, description="what `hybrid tune` measured when it chose the default fusion")
    metadata: dict[str, Any] = Field(description="metadata fields: filter type, or why not filterable")
    stats: Stats
    disk_bytes: int = Field(description="size of its folder on disk (the model files, shared by hard links, counted)")
    memory_bytes: int = Field(description="what it holds in memory or maps: index files but stored texts and model; live vectors")
    created_at: str
    index: str = Field(description="its folder")


class AliasSet(_Strict):
    collection: str = Field(pattern=f"^{NAME_RULE.pattern}$", examples=["products-v2"])


class AliasList(BaseModel):
    aliases: dict[str, str] = Field(description="alias -> collection")


class TaskInfo(BaseModel):
    id: str
    collection: str
    state: Literal["queued", "running", "succeeded", "failed", "interrupted"]
    documents_total: int
    documents_done: int = Field(description="documents durable in the collection (acknowledged)")
    documents_per_second: float | None = None
    last_sequence: int | None = Field(None, description="the sequence number of the last batch logged")
    error: str | None = None
    created_at: str
    started_at: str | None = None
    finished_at: str | None = None
    seconds: float


class TaskList(BaseModel):
    tasks: list[TaskInfo]


class SnapshotOut(BaseModel):
    id: str = Field(examples=["products-20261125T101500123456Z"])
    collection: str = Field(description="the collection it was taken of")
    sequence: int = Field(description="the last write it holds: a restore holds exactly the writes acknowledged up to it")
    documents: int
    bytes: int = Field(description="size of the snapshot file")
    created_at: str
    manifest_sha256: str = Field(description="sha256 of the collection's manifest.json it holds")
    model: Literal["included", "referenced"] = Field(
        "included", description="referenced: it holds its model's sha256s, not its files, and restores where that model is"
    )
    format: int


class SnapshotList(BaseModel):
    snapshots: list[SnapshotOut] = Field(description="oldest first")


class SnapshotRestore(_Strict):
    snapshot: str = Field(description="the id of a listed snapshot", examples=["products-20261125T101500123456Z"])
