"""Boosts: what an application knows about its documents (popularity, freshness, a campaign) added to the relevance
score after fusion and reranking, each contribution shown by `explain`.

    "boosts": [
        {"field": "popularity", "modifier": "log1p", "weight": 0.1},
        {"decay": "gauss", "field": "published", "origin": "2024-06-01", "scale": "30d", "offset": "7d", "weight": 0.2},
        {"filter": {"tag": "sale"}, "weight": 0.05}
    ]

A boost's value of a document is one of
    field   modifier(v) of a numeric field (int, float, bool as 0/1), `missing` where a document has none;
            modifiers as Elasticsearch's field_value_factor: none, log1p (log10(1 + v)), ln1p, sqrt, square
            (a value below 0 counts as 0 for log1p, ln1p and sqrt)
    decay   how near v is to `origin` on a number or date field, as Elasticsearch's decay functions: with
            d = max(0, |v - origin| - offset), gauss exp(-d^2 / 2s^2), s^2 = -scale^2 / (2 ln decay);
            exp exp(d ln(decay) / scale); linear max(0, 1 - d (1 - decay) / scale): 1 within `offset`, `decay`
            at `offset + scale`; 0 where a document has no value. Dates take ISO-8601 or "now" as origin and
            durations as "30d" (s, m, h, d, w) or seconds
    filter  1 where the filter admits the document, else 0.

`boost_mode` combines them with the score s: "sum" adds each weight * value; "product" multiplies s by
(1 + sum of weight * value), scaled by |s| so that a positive boost lifts a negative score too. Either way each
boost's contribution is a term of `final = s + sum of contributions`, which `explain` lists.
"""

from __future__ import annotations

import functools
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from hybrid_retrieval.common.errors import SpecError
from hybrid_retrieval.search import checks
from hybrid_retrieval.search.filters.columns import MetadataColumns, ValueColumn
from hybrid_retrieval.search.filters.types import parse_date, short_text

BOOST_MODES = ("sum", "product")
MODIFIERS = ("none", "log1p", "ln1p", "sqrt", "square")
DECAYS = ("gauss", "exp", "linear")
NUMERIC_TYPES = ("int", "float", "bool")
DECAY_TYPES = ("int", "float", "date")
MAX_BOOSTS = 16
MAX_WEIGHT = 1e6
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(s|m|h|d|w)")
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_SHAPES = (
    '{"field": F, "modifier": M, "weight": W}, {"decay": "gauss", "field": F, "origin": O, "scale": S, "weight": W} '
    'or {"filter": {...}, "weight": W}'
)

_MODIFIER: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "none": lambda v: v,
    "log1p": lambda v: np.log10(1 + np.maximum(v, 0)),
    "ln1p": lambda v: np.log1p(np.maximum(v, 0)),
    "sqrt": lambda v: np.sqrt(np.maximum(v, 0)),
    "square": np.square,
}


@dataclass(frozen=True)
class FieldBoost:
    field: str
    modifier: str = "none"
    missing: float = 0.0  # the value of a document without one
    weight: float = 1.0

    def to_dict(self) -> dict[str, Any]:
        return {"field": self.field, "modifier": self.modifier, "missing": self.missing, "weight": self.weight}


@dataclass(frozen=True)
class DecayBoost:
    decay_function: str  # gauss | exp | linear
    field: str
    origin: float | str  # a number, or for a date field an ISO-8601 text or "now"
    scale: float | str  # > 0: a number, or for a date field a duration ("30d") or seconds
    offset: float | str = 0.0
    decay_at_scale: float = 0.5  # the value at offset + scale, in (0, 1)
    weight: float = 1.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "decay": self.decay_function,
            "field": self.field,
            "origin": self.origin,
            "scale": self.scale,
            "offset": self.offset,
            "decay_at_scale": self.decay_at_scale,
            "weight": self.weight,
        }

    def values(self, field_values: np.ndarray) -> np.ndarray:
        """The decay of each value, in the field's unit (seconds for a date): 1 within `offset` of the origin."""
        origin = time.time() if self.origin == "now" else self._numbers[0]
        _, offset, scale = self._numbers
        distances = np.maximum(np.abs(field_values - origin) - offset, 0.0)
        if self.decay_function == "gauss":
            return np.exp(distances**2 * (math.log(self.decay_at_scale) / scale**2))  # = exp(-d^2 / 2s^2)
        if self.decay_function == "exp":
            return np.exp(distances * (math.log(self.decay_at_scale) / scale))
        return np.maximum(1.0 - distances * ((1.0 - self.decay_at_scale) / scale), 0.0)

    @functools.cached_property
    def _numbers(self) -> tuple[float, float, float]:
        """(origin, offset, scale) as numbers, parsed once (the origin "now" is read at each search instead)."""
        return (0.0 if self.origin == "now" else _origin(self.origin)), _length(self.offset), _length(self.scale)


@dataclass(frozen=True)
class FilterBoost:
    filter: dict[str, Any]
    weight: float = 1.0

    def to_dict(self) -> dict[str, Any]:
        return {"filter": self.filter, "weight": self.weight}


Boost = FieldBoost | DecayBoost | FilterBoost


def _origin(origin: float | str) -> float:
    if origin == "now":
        return time.time()
    return parse_date(origin) if isinstance(origin, str) else float(origin)  # type: ignore[return-value]  # checked


def _length(value: float | str) -> float:
    if isinstance(value, str):
        match = _DURATION.fullmatch(value)
        assert match is not None  # checked by check_boosts
        return float(match.group(1)) * _SECONDS[match.group(2)]
    return float(value)


def _check_length(path: str, value: object, positive: bool) -> float | str:
    """A scale or offset: a number (> 0 for a scale, >= 0 for an offset) or a duration text such as "30d"."""
    if isinstance(value, str):
        match = _DURATION.fullmatch(value)
        if match is None:
            raise SpecError(path, f"must be a number or a duration such as 30d, 12h (units s, m, h, d, w), got {short_text(value)}")
        if positive and float(match.group(1)) == 0:
            raise SpecError(path, f"must be above 0, got {value!r}")
        return value
    return checks.number(path, value, 0, above=positive)


def _check_origin(path: str, value: object) -> float | str:
    if isinstance(value, str):
        if value != "now" and parse_date(value) is None:
            raise SpecError(path, f'must be a number, an ISO-8601 date or "now", got {short_text(value)}')
        return value
    return checks.number(path, value)


def _only(path: str, given: dict, known: tuple[str, ...]) -> None:
    for key in given:
        if key not in known:
            raise SpecError(f"{path}.{key}", f"unknown field; valid: {', '.join(known)}")


def check_boost(value: object, path: str) -> Boost:
    """One boost from its dict form (SpecError naming the part that is wrong); the index checks its field."""
    if not isinstance(value, dict):
        raise SpecError(path, f"must be an object: {_SHAPES}, got {short_text(value)}")
    weight = checks.number(f"{path}.weight", value.get("weight", 1.0), -MAX_WEIGHT, MAX_WEIGHT)
    if "filter" in value:
        _only(path, value, ("filter", "weight"))
        if not isinstance(value["filter"], dict) or not value["filter"]:
            given = short_text(value["filter"])
            raise SpecError(f"{path}.filter", f'must be a non-empty filter object such as {{"tag": "sale"}}, got {given}')
        return FilterBoost(value["filter"], weight)
    if not isinstance(value.get("field"), str):
        raise SpecError(f"{path}.field", f"must name a metadata field: {_SHAPES}")
    if "decay" in value:
        _only(path, value, ("decay", "field", "origin", "scale", "offset", "decay_at_scale", "weight"))
        for required in ("origin", "scale"):
            if required not in value:
                raise SpecError(f"{path}.{required}", "required for a decay boost")
        return DecayBoost(
            checks.choice(f"{path}.decay", value["decay"], DECAYS),
            value["field"],
            _check_origin(f"{path}.origin", value["origin"]),
            _check_length(f"{path}.scale", value["scale"], positive=True),
            _check_length(f"{path}.offset", value.get("offset", 0.0), positive=False),
            checks.number(f"{path}.decay_at_scale", value.get("decay_at_scale", 0.5), 0, 1, above=True),
            weight,
        )
    _only(path, value, ("field", "modifier", "missing", "weight"))
    modifier = checks.choice(f"{path}.modifier", value.get("modifier", "none"), MODIFIERS)
    return FieldBoost(value["field"], modifier, checks.number(f"{path}.missing", value.get("missing", 0.0)), weight)


def check_boosts(value: object) -> tuple[Boost, ...]:
    """A request's `boosts` (a list of their dict forms; None or [] for none)."""
    if value is None:
        return ()
    if isinstance(value, tuple) and all(isinstance(b, (FieldBoost, DecayBoost, FilterBoost)) for b in value):
        return value
    if not isinstance(value, list):
        raise SpecError("boosts", f"must be a list of boosts, each {_SHAPES}; got {short_text(value)}")
    if len(value) > MAX_BOOSTS:
        raise SpecError("boosts", f"at most {MAX_BOOSTS} boosts, got {len(value)}")
    return tuple(check_boost(item, f"boosts[{i}]") for i, item in enumerate(value))


def check_fields(boosts: tuple[Boost, ...], metadata: MetadataColumns | None) -> None:
    """Each boost's field exists in the index with a type it can read; a filter boost's filter is valid."""
    for i, boost in enumerate(boosts):
        if metadata is None:
            raise SpecError(("boosts", i), "this index has no filterable metadata fields to boost by")
        if isinstance(boost, FilterBoost):
            try:
                metadata.allowed(boost.filter)
            except SpecError as exc:
                raise exc.within(("boosts", i)) from None
            continue
        types = DECAY_TYPES if isinstance(boost, DecayBoost) else NUMERIC_TYPES
        info = metadata.fields.get(boost.field)
        if info is None or info.type not in types or boost.field not in metadata.columns:
            fitting = ", ".join(name for name in metadata.filterable if metadata.fields[name].type in types) or "none"
            why = f"{short_text(boost.field)} is not a filterable field of type {', '.join(types)}; such fields: {fitting}"
            raise SpecError(("boosts", i, "field"), why)
        if isinstance(boost, DecayBoost):
            is_date = info.type == "date"
            for name in ("origin", "scale", "offset"):
                if isinstance(getattr(boost, name), str) and not is_date:
                    raise SpecError(("boosts", i, name), f"{boost.field} is a number field: give a number")
            if isinstance(boost.origin, (int, float)) and is_date:
                raise SpecError(("boosts", i, "origin"), f'{boost.field} is a date field: give an ISO-8601 date or "now"')


@dataclass(frozen=True)
class Boosted:
    """The scores of some documents before their boosts, and each boost's contribution (rows: boosts)."""

    doc_idx: np.ndarray
    base: np.ndarray
    values: np.ndarray  # (boosts, docs): each boost's value of each document, before its weight
    contributions: np.ndarray  # (boosts, docs)

    def explain(self, doc: int, boosts: tuple[Boost, ...]) -> dict[str, Any] | None:
        at = np.flatnonzero(self.doc_idx == doc)
        if not len(at):
            return None
        i = int(at[0])
        return {
            "base": float(self.base[i]),
            "boosts": [
                {**boost.to_dict(), "value": float(self.values[b, i]), "contribution": float(self.contributions[b, i])}
                for b, boost in enumerate(boosts)
            ],
        }


def boost_values(boosts: tuple[Boost, ...], rows: np.ndarray, metadata: MetadataColumns) -> np.ndarray:
    """(boosts, documents): each boost's value of the documents at `rows` of `metadata` (module docstring)."""
    docs = rows
    values = np.zeros((len(boosts), len(docs)), dtype=np.float64)
    for b, boost in enumerate(boosts):
        if isinstance(boost, FilterBoost):
            values[b] = metadata.allowed(boost.filter).mask[docs]
            continue
        column = metadata.columns[boost.field]
        assert isinstance(column, ValueColumn)  # check_fields: a number, bool or date field
        present, raw = column.present[docs], column.values[docs].astype(np.float64)
        if isinstance(boost, FieldBoost):
            values[b] = _MODIFIER[boost.modifier](np.where(present, raw, boost.missing))
        else:
            values[b] = np.where(present, boost.values(raw), 0.0)
    return values


def apply_boosts(
    docs: np.ndarray, scores: np.ndarray, boosts: tuple[Boost, ...], mode: str, metadata: MetadataColumns, rows: np.ndarray
) -> Boosted:
    """The boosts' values of `docs`, scored `scores`, and their contributions (module docstring); `rows`: the
    documents' rows in `metadata`."""
    base = scores.astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # what overflows is refused below
        values = boost_values(boosts, rows, metadata)
        weights = np.array([boost.weight for boost in boosts], dtype=np.float64)[:, None]
        contributions = weights * values * (np.abs(base) if mode == "product" else 1.0)
        overflowing = ~np.isfinite(contributions).all(axis=1)
        if not overflowing.any() and not np.isfinite(contributions.sum(axis=0) + base).all():  # finite alone, not in sum
            overflowing = np.abs(contributions).max(axis=1) == np.abs(contributions).max()
    if overflowing.any():
        first = int(np.flatnonzero(overflowing)[0])
        raise SpecError(("boosts", first), "its contributions overflow to infinity for some documents: lower its weight or values")
    return Boosted(docs, base, values, contributions)
