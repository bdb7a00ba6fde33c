"""The search specification: everything that decides how a query is ranked, validated in one place.

The spec a request is served with is built by merging partial specs, each in the dict form, onto
the library defaults below, in order: the index's defaults (its manifest: the tuned fusion, a fitted
hubness correction), the service's settings (reranker depth and weight), then the request.
`SearchSpec.merge` validates every field it is given; an error names the field by its dotted path
(`rerank.weight`), whoever wrote the value.

Two forms, both round-tripping (`SearchSpec.from_dict(spec.to_dict()) == spec` and
`SearchSpec.from_dict(parse_spec_string(spec.to_string())) == spec`; the string leaves out what equals
the library default where it can, e.g. RRF weights [1, 1] and an unset min_score):

    dict    {"mode": "hybrid", "depth": 100, "fusion": {"method": "cc", "alpha": 0.5, "norm": "zscore"},
             "hubness": {"method": "none", "dynamic": false},
             "rerank": {"enabled": false, "depth": 50, "weight": 1.0}, "min_score": null,
             "filter": {"year": {"gte": 2015}},
             "highlight": {"enabled": true, "semantic": false, "snippet_chars": 160, "snippets": 1}, "typo": "auto"}
    string  hybrid+cc:zscore:0.5+depth:100+nohub+rerank:off:d=50:w=1+highlight:chars=160:snippets=1+filter:{"year": {"gte": 2015}}

The string form (`hybrid eval --pipelines`) names only what it sets: MODE (bm25, dense, hybrid) or a
fusion (which implies hybrid) first, then any of `+rrf[:RRF_K[:w=B,D]]`, `+cc[:NORM[:ALPHA]]`,
`+depth:N`, `+qbnorm[:dis]`, `+dbnorm[:dis]`, `+nohub`, `+rerank[:on|:off][:d=N][:w=W]`, `+min:SCORE`,
`+highlight[:on|:off][:semantic][:chars=N][:snippets=N]`, `+typo:auto|0|1|2`, `+fields:title=W,text=W`, and last
`+filter:JSON`
(search.filters; the JSON runs to the end of the string, so it may contain "+"), or with boosts or a sort
`+json:{"filter": ..., "boosts": [...], "boost_mode": ..., "sort": [...]}` (search.boosts, search.sorting).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields, replace
from typing import Any, TypeVar

from hybrid_retrieval.common.errors import SpecError
from hybrid_retrieval.search import checks
from hybrid_retrieval.search.boosts import BOOST_MODES, Boost, check_boosts
from hybrid_retrieval.search.fields import check_text_fields
from hybrid_retrieval.search.filters.language import check_filter
from hybrid_retrieval.search.fusion import (
    DEFAULT_FUSION,
    FUSIONS,
    Fusion,
    fusion_from_dict,
    fusion_from_string,
    fusion_to_dict,
    fusion_to_string,
)
from hybrid_retrieval.search.highlight import DEFAULT_SNIPPET_CHARS, DEFAULT_SNIPPETS, check_snippet_options
from hybrid_retrieval.search.hubness import HUBNESS_METHODS
from hybrid_retrieval.search.rerank import DEFAULT_RERANK_DEPTH, MAX_RERANK_DEPTH, check_weight
from hybrid_retrieval.search.sorting import SortKey, check_sort, sort_to_list
from hybrid_retrieval.search.typo import DEFAULT_TYPO, check_typo

MODES = ("bm25", "dense", "hybrid")
JSON_TAIL = ("filter", "boosts", "boost_mode", "sort")  # the string form's last part, as JSON
MAX_K = 1000
MAX_DEPTH = 1000
DEFAULT_DEPTH = 100
AGGREGATIONS = ("max", "soft")  # how a document scores from its passages (search.passages)
BM25_UNITS = ("document", "passages")


@dataclass(frozen=True)
class HubnessSpec:
    method: str = "none"  # none | qbnorm | dbnorm
    dynamic: bool = False  # DIS: correct only queries whose raw top-1 is in the bank's activation set

    def __post_init__(self) -> None:
        checks.choice("method", self.method, HUBNESS_METHODS)
        if checks.flag("dynamic", self.dynamic) and self.method == "none":
            object.__setattr__(self, "dynamic", False)  # dynamic only says when to apply a correction


@dataclass(frozen=True)
class RerankSpec:
    enabled: bool = False
    depth: int = DEFAULT_RERANK_DEPTH  # first-stage hits the cross-encoder reorders; the rest follow
    weight: float = 1.0  # trust in the cross-encoder (search.rerank.interpolate)

    def __post_init__(self) -> None:
        checks.flag("enabled", self.enabled)
        object.__setattr__(self, "depth", checks.number("depth", self.depth, 1, MAX_RERANK_DEPTH, integer=True))
        object.__setattr__(self, "weight", check_weight(self.weight))


@dataclass(frozen=True)
class HighlightSpec:
    enabled: bool = False  # mark the query's terms (through the index's analyzer) in snippets of title and text
    semantic: bool = False  # also, for a hit no query term matches, the sentence most similar to the query
    snippet_chars: int = DEFAULT_SNIPPET_CHARS  # about how long a snippet is
    snippets: int = DEFAULT_SNIPPETS  # at most this many snippets of the text, best first

    def __post_init__(self) -> None:
        checks.flag("enabled", self.enabled)
        checks.flag("semantic", self.semantic)
        chars, count = check_snippet_options(self.snippet_chars, self.snippets)
        object.__setattr__(self, "snippet_chars", chars)
        object.__setattr__(self, "snippets", count)


@dataclass(frozen=True)
class PassageSpec:
    """How a chunked index scores a document from its passages (search.passages.aggregate): in the dense leg, `max`
    (its best passage) or `soft` (τ · log Σ exp(s / τ) over its `top` best passages); in the BM25 leg, the whole
    `document` or its best passage (`passages`)."""

    aggregation: str = "max"
    temperature: float = 0.05  # soft: the cosine difference at which a second passage counts e times less
    top: int = 3  # soft: passages of a document that count
    bm25: str = "document"  # the BM25 leg scores the whole document, or (passages) its best passage

    def __post_init__(self) -> None:
        checks.choice("aggregation", self.aggregation, AGGREGATIONS)
        checks.choice("bm25", self.bm25, BM25_UNITS)
        object.__setattr__(self, "temperature", checks.number("temperature", self.temperature, 0, 10, above=True))
        object.__setattr__(self, "top", checks.number("top", self.top, 1, 100, integer=True))


_Part = TypeVar("_Part", "HubnessSpec", "RerankSpec", "HighlightSpec", "PassageSpec")


def _merge_part(cls: type[_Part], base: _Part, given: object, name: str) -> _Part:
    """`base` (a HubnessSpec or RerankSpec) with the fields `given` names replaced; errors under `name`."""
    if not isinstance(given, dict):
        raise SpecError(name, f"must be an object with fields {', '.join(f.name for f in fields(cls))}, got {given!r}")
    known = [f.name for f in fields(cls)]
    try:
        for key in given:
            if key not in known:
                raise SpecError(key, f"unknown field; valid: {', '.join(known)}")
        return replace(base, **given)
    except SpecError as exc:
        raise exc.within(name) from None


@dataclass(frozen=True)
class SearchSpec:
    """How to rank: retrieval mode, candidate depth, fusion, hubness correction, reranking, score floor.

    `k` (how many hits) is the request's, not the spec's: the same spec serves every page size. New
    request options (filters, highlighting) become fields here, with their dict and string forms.
    """

    mode: str = "hybrid"
    depth: int = DEFAULT_DEPTH  # hybrid: candidates per retriever, fused; independent of k
    fusion: Fusion = DEFAULT_FUSION  # hybrid only
    hubness: HubnessSpec = field(default_factory=HubnessSpec)  # dense and hybrid only
    rerank: RerankSpec = field(default_factory=RerankSpec)
    min_score: float | None = None  # drop hits whose final score is below it
    filter: dict[str, Any] | None = None  # which documents may be retrieved (search.filters); checked by the index
    highlight: HighlightSpec = field(default_factory=HighlightSpec)
    passage_scoring: PassageSpec = field(default_factory=PassageSpec)  # a chunked index's dense leg (search.passages)
    typo: str | int = DEFAULT_TYPO  # the lexical leg's typo tolerance (search.typo): "auto", 0, 1 or 2
    boosts: tuple[Boost, ...] = ()  # added to the final score (search.boosts); checked against the index's fields
    boost_mode: str = "sum"  # sum | product (search.boosts)
    sort: tuple[SortKey, ...] = ()  # order the candidates by fields (search.sorting); () by score
    text_fields: dict[str, float] | None = None  # BM25F weights of title and text (search.fields); None: one field

    @property
    def steered(self) -> bool:
        """Whether boosts or a sort reorder the candidates: a single retriever's then stop at `depth` too, so pages
        stay the same whatever their size."""
        return bool(self.boosts or self.sort)

    def __post_init__(self) -> None:
        checks.choice("mode", self.mode, MODES)
        object.__setattr__(self, "depth", checks.number("depth", self.depth, 1, MAX_DEPTH, integer=True))
        if not isinstance(self.fusion, tuple(FUSIONS.values())):
            raise SpecError("fusion", f"must be one of {', '.join(FUSIONS)}, got {self.fusion!r}")
        if self.min_score is not None:
            object.__setattr__(self, "min_score", checks.number("min_score", self.min_score))
        object.__setattr__(self, "filter", check_filter(self.filter))
        object.__setattr__(self, "typo", check_typo(self.typo))
        object.__setattr__(self, "boosts", check_boosts(self.boosts))
        checks.choice("boost_mode", self.boost_mode, BOOST_MODES)
        object.__setattr__(self, "sort", check_sort(self.sort))
        object.__setattr__(self, "text_fields", check_text_fields(self.text_fields))

    def merge(self, overrides: dict[str, Any] | None) -> SearchSpec:
        """This spec with the fields of the partial dict form `overrides` replaced, validated."""
        if not overrides:
            return self
        if not isinstance(overrides, dict):
            raise SpecError("spec", f"must be an object, got {overrides!r}")
        known = [f.name for f in fields(self)]
        changes: dict[str, Any] = {}
        for name, value in overrides.items():
            if name not in known:
                raise SpecError(name, f"unknown field; valid: {', '.join(known)}")
            if name == "fusion":
                try:
                    changes[name] = fusion_from_dict(value, self.fusion)
                except SpecError as exc:
                    raise exc.within("fusion") from None
            elif name == "hubness":
                changes[name] = _merge_part(HubnessSpec, self.hubness, value, name)
            elif name == "rerank":
                changes[name] = _merge_part(RerankSpec, self.rerank, value, name)
            elif name == "highlight":
                # `true` / `false` switch it; an object switches it on unless it says "enabled": false
                given = {"enabled": value} if isinstance(value, bool) else {"enabled": True, **value} if isinstance(value, dict) else value
                changes[name] = _merge_part(HighlightSpec, self.highlight, given, name)
            elif name == "passage_scoring":
                changes[name] = _merge_part(PassageSpec, self.passage_scoring, value, name)
            else:
                changes[name] = value
        return replace(self, **changes)

    @classmethod
    def from_dict(cls, spec: dict[str, Any]) -> SearchSpec:
        """A full spec from a (possibly partial) dict: fields not given are the library defaults."""
        return cls().merge(spec)

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "depth": self.depth,
            "fusion": fusion_to_dict(self.fusion),
            "hubness": {"method": self.hubness.method, "dynamic": self.hubness.dynamic},
            "rerank": {"enabled": self.rerank.enabled, "depth": self.rerank.depth, "weight": self.rerank.weight},
            "min_score": self.min_score,
            "filter": self.filter,
            "highlight": {
                "enabled": self.highlight.enabled,
                "semantic": self.highlight.semantic,
                "snippet_chars": self.highlight.snippet_chars,
                "snippets": self.highlight.snippets,
            },
            "passage_scoring": {
                "aggregation": self.passage_scoring.aggregation,
                "temperature": self.passage_scoring.temperature,
                "top": self.passage_scoring.top,
                "bm25": self.passage_scoring.bm25,
            },
            "typo": self.typo,
            "boosts": [boost.to_dict() for boost in self.boosts],
            "boost_mode": self.boost_mode,
            "sort": sort_to_list(self.sort),
            "text_fields": self.text_fields,
        }

    def to_string(self) -> str:
        return spec_to_string(self.to_dict())


def spec_to_string(spec: dict[str, Any]) -> str:  # noqa: C901
    """The string form of a (possibly partial) dict form that names a mode: only the fields it names."""
    if "mode" not in spec:
        raise SpecError("mode", "the string form starts with the mode; this spec has none")
    parts = [spec["mode"]]
    if "fusion" in spec:
        try:
            parts.append(fusion_to_string(fusion_from_dict(spec["fusion"])))
        except SpecError as exc:
            raise exc.within("fusion") from None
    if "depth" in spec:
        parts.append(f"depth:{spec['depth']}")
    hubness = spec.get("hubness")
    if hubness is not None:
        method = hubness.get("method", "none")
        parts.append("nohub" if method == "none" else method + (":dis" if hubness.get("dynamic") else ""))
    rerank = spec.get("rerank")
    if rerank is not None:
        text = "rerank"
        if "enabled" in rerank:
            text += ":on" if rerank["enabled"] else ":off"
        if "depth" in rerank:
            text += f":d={rerank['depth']}"
        if "weight" in rerank:
            text += f":w={checks.compact(rerank['weight'])}"
        parts.append(text)
    if spec.get("min_score") is not None:
        parts.append(f"min:{checks.compact(spec['min_score'])}")
    highlight = spec.get("highlight")
    if highlight is not None and highlight != SearchSpec().to_dict()["highlight"]:  # named only when asked for
        highlight = {"enabled": highlight} if isinstance(highlight, bool) else highlight
        text = "highlight" + ("" if highlight.get("enabled", True) else ":off") + (":semantic" if highlight.get("semantic") else "")
        text += "".join(
            f":{key}={highlight[name]}" for key, name in (("chars", "snippet_chars"), ("snippets", "snippets")) if name in highlight
        )
        parts.append(text)
    scoring = spec.get("passage_scoring")
    if scoring is not None and scoring != SearchSpec().to_dict()["passage_scoring"]:  # named only when not the default
        text = "passages:" + scoring.get("aggregation", "max")
        numbers = "".join(
            f":{key}={checks.compact(scoring[name])}" for key, name in (("t", "temperature"), ("top", "top")) if name in scoring
        )
        text += numbers + (f":bm25={scoring['bm25']}" if "bm25" in scoring else "")
        parts.append(text)
    if "typo" in spec and spec["typo"] != DEFAULT_TYPO:  # named only when not the default
        parts.append(f"typo:{spec['typo']}")
    if spec.get("text_fields"):
        parts.append("fields:" + ",".join(f"{name}={checks.compact(weight)}" for name, weight in spec["text_fields"].items()))
    tail = {name: spec[name] for name in JSON_TAIL if spec.get(name) and spec[name] != SearchSpec().to_dict()[name]}
    if list(tail) == ["filter"]:
        parts.append("filter:" + json.dumps(tail["filter"], ensure_ascii=False))
    elif tail:
        parts.append("json:" + json.dumps(tail, ensure_ascii=False))
    return "+".join(parts)


def parse_spec_string(text: str) -> dict[str, Any]:  # noqa: C901
    """The partial dict form of a string form; unknown parts are errors that list the valid ones."""
    spec: dict[str, Any] = {}
    if "+json:" in text:
        text, _, json_text = text.partition("+json:")
        tail = _json_part("json", json_text)
        if not isinstance(tail, dict) or not set(tail) <= set(JSON_TAIL):
            raise SpecError("json", f"must be an object of {', '.join(JSON_TAIL)}, got {json_text[:60]!r}")
        spec.update(tail)
    else:
        text, _, filter_text = text.partition("+filter:")
        if filter_text:
            spec["filter"] = check_filter(_json_part("filter", filter_text))
    first, *extras = text.split("+")
    if first in MODES:
        spec["mode"] = first
    elif first.split(":")[0] in FUSIONS:
        spec["mode"] = "hybrid"
        spec["fusion"] = fusion_from_string(first)
    else:
        raise SpecError("mode", f"{text!r} starts with {first!r}; valid: {', '.join(MODES)}, rrf[:...], cc[:...]")
    for extra in extras:
        name, _, arg = extra.partition(":")
        if name in FUSIONS:
            spec["fusion"] = fusion_from_string(extra)
        elif name == "depth":
            spec["depth"] = _integer("depth", arg)
        elif name in ("qbnorm", "dbnorm") and arg in ("", "dis"):
            spec["hubness"] = {"method": name, "dynamic": arg == "dis"}
        elif name == "nohub" and not arg:
            spec["hubness"] = {"method": "none", "dynamic": False}
        elif name == "rerank":
            spec["rerank"] = _parse_rerank(arg)
        elif name == "min":
            spec["min_score"] = checks.parse_number("min_score", arg)
        elif name == "highlight":
            spec["highlight"] = _parse_highlight(arg)
        elif name == "passages":
            spec["passage_scoring"] = _parse_passages(arg)
        elif name == "typo":
            spec["typo"] = check_typo(int(arg) if arg.isdigit() else arg)
        elif name == "fields":
            spec["text_fields"] = _parse_fields(arg)
        else:
            raise SpecError(
                "spec",
                f"unknown part {extra!r} in {text!r}; valid: rrf[:...], cc[:...], depth:N, qbnorm[:dis], "
                "dbnorm[:dis], nohub, rerank[:on|:off][:d=N][:w=W], min:SCORE, "
                "highlight[:on|:off][:semantic][:chars=N][:snippets=N], passages:max|soft[:t=T][:top=N][:bm25=U], "
                "typo:auto|0|1|2, fields:title=W,text=W, filter:JSON or json:JSON (last)",
            )
    return spec


def _parse_fields(arg: str) -> dict[str, float]:
    weights = {}
    for part in arg.split(","):
        name, _, weight = part.partition("=")
        weights[name] = checks.parse_number(f"text_fields.{name}", weight)
    return weights


def _json_part(name: str, text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise SpecError(name, f"not JSON ({exc}): {text[:60]!r}") from None


def _parse_rerank(arg: str) -> dict[str, Any]:
    rerank: dict[str, Any] = {"enabled": True}
    for part in filter(None, arg.split(":")):
        if part in ("on", "off"):
            rerank["enabled"] = part == "on"
        elif part.startswith("d="):
            rerank["depth"] = _integer("rerank.depth", part[2:])
        elif part.startswith("w="):
            rerank["weight"] = checks.parse_number("rerank.weight", part[2:])
        else:
            raise SpecError("rerank", f"unknown part {part!r}; valid: rerank[:on|:off][:d=N][:w=W]")
    return rerank


def _parse_highlight(arg: str) -> dict[str, Any]:
    highlight: dict[str, Any] = {"enabled": True}
    for part in filter(None, arg.split(":")):
        if part in ("on", "off"):
            highlight["enabled"] = part == "on"
        elif part == "semantic":
            highlight["semantic"] = True
        elif part.startswith("chars="):
            highlight["snippet_chars"] = _integer("highlight.snippet_chars", part[6:])
        elif part.startswith("snippets="):
            highlight["snippets"] = _integer("highlight.snippets", part[9:])
        else:
            raise SpecError("highlight", f"unknown part {part!r}; valid: highlight[:on|:off][:semantic][:chars=N][:snippets=N]")
    return highlight


def _parse_passages(arg: str) -> dict[str, Any]:
    method, *options = arg.split(":")
    scoring: dict[str, Any] = {"aggregation": checks.choice("passage_scoring.aggregation", method, AGGREGATIONS)}
    for part in options:
        if part.startswith("t="):
            scoring["temperature"] = checks.parse_number("passage_scoring.temperature", part[2:])
        elif part.startswith("top="):
            scoring["top"] = _integer("passage_scoring.top", part[4:])
        elif part.startswith("bm25="):
            scoring["bm25"] = checks.choice("passage_scoring.bm25", part[5:], BM25_UNITS)
        else:
            raise SpecError("passage_scoring", f"unknown part {part!r}; valid: passages:max|soft[:t=T][:top=N][:bm25=document|passages]")
    return scoring


def _integer(name: str, text: str) -> float:
    value = checks.parse_number(name, text)
    return int(value) if value.is_integer() else value  # an int, or a fraction fails the field's own check


def check_k(k: object) -> int:
    """The number of hits a request asks for (not part of the spec: see SearchSpec)."""
    return checks.number("k", k, 1, MAX_K, integer=True)
