"""The search spec's fields as a request, or a collection's defaults, set them: fusion, hubness correction,
reranking, highlights, passage scoring and the filter."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, StrictBool
from pydantic.json_schema import JsonValue

from hybrid_retrieval.app.schemas.shared import Float, Int, Strict, documented
from hybrid_retrieval.search.boosts import BOOST_MODES, DECAYS, MAX_BOOSTS, MODIFIERS
from hybrid_retrieval.search.filters.language import MAX_FILTER_DEPTH, MAX_LIST_VALUES, OPERATORS
from hybrid_retrieval.search.fusion import MAX_RRF_K, MAX_RRF_WEIGHT
from hybrid_retrieval.search.highlight import SNIPPET_CHARS_RANGE, SNIPPETS_RANGE
from hybrid_retrieval.search.hubness import HUBNESS_METHODS
from hybrid_retrieval.search.normalize import NORMALIZERS
from hybrid_retrieval.search.rerank import MAX_RERANK_DEPTH
from hybrid_retrieval.search.sorting import MAX_SORT_KEYS
from hybrid_retrieval.search.spec import AGGREGATIONS, BM25_UNITS, MAX_DEPTH, MODES

# The search spec's fields are typed here and validated by search.spec alone (one set of rules for the API,
# the manifest and the CLI); the ranges and choices below only document them, from the same constants.
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
FILTER_EXAMPLES: list[JsonValue] = [
    {"year": {"gte": 2015}, "journal": {"in": ["Nature", "Cell"]}, "open_access": True},
    {"$or": [{"tags": "oncology"}, {"published": {"gte": "2020-01-01", "lt": "2021-01-01"}}], "$not": {"journal": "Cell"}},
]


BOOSTS_DESCRIPTION = f"""Added to each candidate's final score after fusion and reranking (up to {MAX_BOOSTS}), each shown
by `explain`: `{{"field": F, "modifier": M, "missing": V, "weight": W}}` adds W * M(value) of a number or bool field (M one
of {", ".join(MODIFIERS)}; `missing` for documents without one, default 0); `{{"decay": D, "field": F, "origin": O,
"scale": S, "offset": 0, "decay_at_scale": 0.5, "weight": W}}` adds W times how near a number or date is to O (D one of
{", ".join(DECAYS)}: 1 within `offset`, `decay_at_scale` at offset + scale, 0 without a value; dates take ISO-8601 or
"now" and durations such as "30d"); `{{"filter": FILTER, "weight": W}}` adds W where the filter admits the document.
Weights may be negative (a demotion). `boost_mode` says how they combine."""
BOOSTS_EXAMPLES = [
    [{"decay": "gauss", "field": "published", "origin": "now", "scale": "30d", "offset": "2d", "weight": 0.5}],
    [{"field": "popularity", "modifier": "log1p", "weight": 0.2}, {"filter": {"in_stock": True}, "weight": 0.3}],
]


class RRFBody(Strict):
    """score(d) = sum over retrievers o of w_o / (rrf_k + rank_o(d)), ranks from 1, weights [bm25, dense].
    Fields not given come from the index's default fusion when it is RRF too, else RRF's defaults."""

    method: Literal["rrf"]
    rrf_k: Float | None = documented("the RRF constant (not the number of results)", minimum=0, maximum=MAX_RRF_K)
    weights: list[Float] | None = documented(
        f"[bm25, dense], each from 0 to {MAX_RRF_WEIGHT:g}", minItems=2, maxItems=2, items={"minimum": 0, "maximum": MAX_RRF_WEIGHT}
    )


class CCBody(Strict):
    """score(d) = alpha * norm(cosine(d)) + (1 - alpha) * norm(bm25(d)), normalised over the candidates.
    Fields not given come from the index's default fusion when it is cc too, else cc's defaults."""

    method: Literal["cc"]
    alpha: Float | None = documented("weight of the dense retriever", minimum=0, maximum=1)
    norm: str | None = documented("per-query normalisation", enum=list(NORMALIZERS))


FusionBody = Annotated[RRFBody | CCBody, Field(discriminator="method")]


class HubnessBody(Strict):
    method: str | None = documented(
        "hubness correction of dense scores (QB-Norm, DBNorm); default: the index's", enum=list(HUBNESS_METHODS)
    )
    dynamic: StrictBool | None = Field(
        default=None, description="dynamic inverted softmax: correct only queries whose raw top-1 is in the bank's activation set"
    )


class RerankBody(Strict):
    enabled: StrictBool | None = Field(
        default=None, description="rerank with the cross-encoder; default: the service's setting (on when a reranker is configured)"
    )
    depth: Int | None = documented(
        "first-stage hits reranked; hits below it follow in first-stage order, "
        "scores shifted under the reranked ones; default: the service's, 50",
        minimum=1,
        maximum=MAX_RERANK_DEPTH,
    )
    weight: Float | None = documented(
        "trust in the cross-encoder: 1 orders by its logit alone, lower values blend its "
        "z-scored logit with the z-scored first-stage score; default: the service's (the "
        "weight `hybrid train-reranker` tuned on held-out queries, else 1)",
        minimum=0,
        maximum=1,
    )


class PassageScoringBody(Strict):
    aggregation: str | None = documented(
        "a chunked index: a document scores as its best passage (max) or a soft maximum of its best", enum=list(AGGREGATIONS)
    )
    temperature: Float | None = documented("soft: τ in τ·log Σ exp(s/τ) (default 0.05)", exclusiveMinimum=0, maximum=10)
    top: Int | None = documented("soft: the passages of a document that count (default 3)", minimum=1, maximum=100)
    bm25: str | None = documented("the BM25 leg scores the whole document, or its best passage (default document)", enum=list(BM25_UNITS))


class HighlightBody(Strict):
    enabled: StrictBool | None = Field(default=None, description="highlight the hits (default true when this object is given)")
    semantic: StrictBool | None = Field(
        default=None,
        description="for a hit that no query term matches (a purely dense match), also "
        "the sentence of its text nearest the query, by the served embedding model: one "
        "extra model run per request over those hits' sentences (see docs/BENCHMARKS.md)",
    )
    snippet_chars: Int | None = documented(
        "about how many characters a snippet has (default 160)", minimum=SNIPPET_CHARS_RANGE[0], maximum=SNIPPET_CHARS_RANGE[1]
    )
    snippets: Int | None = documented(
        "at most this many snippets of the text, best first (default 1)", minimum=SNIPPETS_RANGE[0], maximum=SNIPPETS_RANGE[1]
    )


class DefaultsBody(Strict):
    """The fields of a search spec that a collection's defaults may set (search.spec validates them)."""

    mode: str | None = documented("retrieval mode; hybrid fuses BM25 and dense candidates; default: the index's (hybrid)", enum=list(MODES))
    depth: Int | None = documented(
        "hybrid candidates per retriever (default from the index, 100); independent of k", minimum=1, maximum=MAX_DEPTH
    )
    fusion: FusionBody | None = Field(
        default=None, description="hybrid fusion; default: what the index was tuned with (equal-weight z-scores if untuned)"
    )
    hubness: HubnessBody | None = Field(
        default=None, description="hubness correction of dense scores; default: what the index was fitted with"
    )
    rerank: RerankBody | None = Field(default=None, description="cross-encoder reranking of the first stage's top hits")
    min_score: Float | None = Field(
        default=None,
        description="drop hits whose final score is below this: the fused score, or "
        "after reranking the logit (weight 1) or the z-score blend (weight < 1)",
    )
    highlight: StrictBool | HighlightBody | None = Field(
        default=None,
        description="mark the query's terms in snippets of each hit's title and text: matched through the index's "
        "analyzer (so `bleeding` marks `bleeds`), HTML-escaped with <mark> tags, with character offsets (Unicode code "
        "points) into the stored field; `true` or an object",
    )
    passage_scoring: PassageScoringBody | None = Field(
        default=None, description="a chunked index: how a document scores from its passages in the dense leg (default: its best passage)"
    )
    typo: Literal["auto", 0, 1, 2] | None = Field(
        default=None,
        description="typo tolerance of the BM25 leg: a query word the collection does not hold is matched to its terms "
        'within this many edits (insertion, deletion, substitution, swap of two adjacent letters); "auto" (the '
        "default): 1 edit for words of 5 letters or more, 2 from 9; 0: off. The variants used are in `typos`",
    )
    boosts: list[dict[str, Any]] | None = Field(
        default=None,
        max_length=MAX_BOOSTS,
        description=BOOSTS_DESCRIPTION,
        json_schema_extra={"examples": BOOSTS_EXAMPLES},  # type: ignore[dict-item]
    )
    boost_mode: str | None = documented(
        "how boosts combine with the score s: sum (s + each weight * value) or product (s + |s| * each weight * value)",
        enum=list(BOOST_MODES),
    )
    text_fields: dict[str, Float] | None = Field(
        default=None,
        description='the BM25 leg\'s fields and their weights, scored as BM25F: {"title": 3, "text": 1} counts a title match '
        'three times a text match, before saturation; a field left out is not searched ({"title": 1}: titles only). '
        "Default: title and text as one field. Needs an index built or compacted since fields came (422 otherwise)",
        examples=[{"title": 3, "text": 1}, {"title": 1}],
    )
    sort: list[str | dict[str, str]] | None = Field(
        default=None,
        max_length=MAX_SORT_KEYS,
        description='order the candidates by fields instead of by score: each key a filterable field ("price", '
        '"price:desc", {"field": "published", "order": "desc"}) or "_score"; documents without the field last in either '
        "order; ties by the final score. The candidates are the ranked ones (hybrid: the fused top `depth` of each "
        "retriever), not the whole collection: raise `depth` to sort more of it",
        examples=[["price"], [{"field": "published", "order": "desc"}, "_score"]],
    )


class SpecBody(DefaultsBody):
    filter: dict[str, Any] | None = Field(default=None, description=FILTER_DESCRIPTION, json_schema_extra={"examples": FILTER_EXAMPLES})
