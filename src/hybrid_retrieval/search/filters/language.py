"""The filter language: a MongoDB-style JSON filter, checked against an index's fields and evaluated over its columns
(search.filters.columns) to the set of documents it admits.

Filter grammar (a JSON object; the fields of one object are ANDed):
    {"year": {"gte": 2015, "lt": 2020}, "journal": {"in": ["Nature", "Cell"]}, "open_access": true,
     "$or": [{"tags": "cancer"}, {"$not": {"year": {"lt": 2000}}}]}
    FIELD: VALUE                 same as FIELD: {"eq": VALUE}
    FIELD: {OP: VALUE, ...}      OP one of eq ne in nin gt gte lt lte exists (or $eq, $ne, ...), ANDed
    "$and": [FILTER, ...]   "$or": [FILTER, ...]   "$not": FILTER
As in MongoDB, `ne` and `nin` also match documents without the field; every other operator needs it.
Ranges apply to int, float, date and keyword (lexicographic) fields.
"""

from __future__ import annotations

import math
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from hybrid_retrieval.common.errors import Loc, SpecError
from hybrid_retrieval.search.filters.types import parse_date, short_text

if TYPE_CHECKING:
    from hybrid_retrieval.search.filters.columns import MetadataColumns

OPERATORS = ("eq", "ne", "in", "nin", "gt", "gte", "lt", "lte", "exists")
RANGES = ("gt", "gte", "lt", "lte")
LOGICAL = ("$and", "$or", "$not")
MAX_FILTER_DEPTH = 16
MAX_LIST_VALUES = 1024


class Allowed:
    """The documents a filter admits: a boolean mask over the corpus and its sorted indices."""

    def __init__(self, mask: np.ndarray):
        self.mask = mask
        self.ids = np.flatnonzero(mask).astype(np.int64)

    @property
    def count(self) -> int:
        return len(self.ids)

    @property
    def fraction(self) -> float:
        return self.count / max(1, len(self.mask))

    @cached_property
    def bitmap(self) -> np.ndarray:
        """The mask packed for faiss.IDSelectorBitmap (bit i of byte i // 8, least significant first)."""
        return np.packbits(self.mask, bitorder="little")


def check_filter(value: object) -> dict | None:
    """A request's filter before the index checks its fields: a JSON object (an empty one: no filter)."""
    if value is None or value == {}:
        return None
    if not isinstance(value, dict):
        raise SpecError("filter", f'must be an object such as {{"year": {{"gte": 2015}}}}, got {short_text(value)}')
    return value


def evaluate(columns: MetadataColumns, filter_: object) -> np.ndarray:
    """The mask of the documents of `columns` that `filter_` admits; SpecError naming the path inside the filter when
    it is invalid."""
    return _evaluate(columns, filter_, ("filter",), 0)


def _evaluate(columns: MetadataColumns, node, path: Loc, depth: int) -> np.ndarray:
    if not isinstance(node, dict):
        raise SpecError(path, f"a filter is an object of field conditions and $and/$or/$not, got {short_text(node)}")
    if depth > MAX_FILTER_DEPTH:
        raise SpecError(path, f"filters nest at most {MAX_FILTER_DEPTH} levels deep")
    mask = np.ones(columns.num_docs, dtype=bool)
    for key, value in node.items():
        where = (*path, key)
        if key in ("$and", "$or"):
            if not isinstance(value, list) or not value:
                raise SpecError(where, f"must be a non-empty list of filters, got {short_text(value)}")
            parts = [_evaluate(columns, item, (*where, i), depth + 1) for i, item in enumerate(value)]
            mask &= np.logical_and.reduce(parts) if key == "$and" else np.logical_or.reduce(parts)
        elif key == "$not":
            mask &= ~_evaluate(columns, value, where, depth + 1)
        elif key.startswith("$"):
            raise SpecError(where, f"unknown logical operator; valid: {', '.join(LOGICAL)}")
        else:
            mask &= _condition(columns, key, value, where)
    return mask


def _condition(columns: MetadataColumns, name: str, condition, path: Loc) -> np.ndarray:  # noqa: C901
    column = columns.columns.get(name)
    if column is None:
        info = columns.fields.get(name)
        why = f"is not filterable ({info.reason})" if info is not None and info.reason else "unknown field"
        raise SpecError(path, f"{why}; filterable fields: {', '.join(columns.filterable) or 'none (this index has no metadata)'}")
    field_type = columns.fields[name].type
    if isinstance(condition, list):
        raise SpecError(path, f'a list is not a value; to match any of several, use {{"in": {short_text(condition)}}}')
    if condition is None:
        raise SpecError(path, 'null is not a value; to match documents without the field, use {"exists": false}')
    shorthand = not isinstance(condition, dict)
    if shorthand:
        condition = {"eq": condition}
    if not condition:
        raise SpecError(path, f"an empty condition; operators: {', '.join(OPERATORS)}")
    mask = np.ones(columns.num_docs, dtype=bool)
    for raw_op, operand in condition.items():
        op = raw_op[1:] if isinstance(raw_op, str) and raw_op.startswith("$") else raw_op
        where = path if shorthand else (*path, raw_op)
        if op not in OPERATORS:
            raise SpecError(where, f"unknown operator; valid: {', '.join(OPERATORS)}")
        if op == "exists":
            if not isinstance(operand, bool):
                raise SpecError(where, f"must be true or false, got {short_text(operand)}")
            mask &= column.present if operand else ~column.present
        elif op in ("eq", "ne"):
            hit = column.any_of([_operand(field_type, operand, where)])
            mask &= hit if op == "eq" else ~hit
        elif op in ("in", "nin"):
            if not isinstance(operand, list) or len(operand) > MAX_LIST_VALUES:
                raise SpecError(where, f"must be a list of at most {MAX_LIST_VALUES} values, got {short_text(operand)}")
            hit = column.any_of([_operand(field_type, v, (*where, i)) for i, v in enumerate(operand)])
            mask &= hit if op == "in" else ~hit
        else:
            if field_type == "bool":
                raise SpecError(where, f"range operators apply to int, float, date and keyword fields; {name!r} is bool")
            bound = _operand(field_type, operand, where)
            low, high = (bound, None) if op in ("gt", "gte") else (None, bound)
            mask &= column.in_range(low, op == "gte", high, op == "lte")
    return mask


def _operand(field_type: str | None, value, path: Loc):
    """A filter value checked against its field's type, in the column's representation."""
    if field_type == "keyword":
        if isinstance(value, str):
            return value
        expected = "a string"
    elif field_type == "bool":
        if isinstance(value, bool):
            return value
        expected = "true or false"
    elif field_type == "date":
        seconds = parse_date(value) if isinstance(value, str) else None
        if seconds is not None:
            return seconds
        expected = 'an ISO-8601 date such as "2015-03-01" or "2015-03-01T10:00:00Z"'
    else:
        if not isinstance(value, bool) and isinstance(value, (int, float)):
            try:
                if math.isfinite(value):
                    return value
            except OverflowError:  # an integer beyond float range
                pass
        expected = "a finite number"
    raise SpecError(path, f"must be {expected} ({field_type} field), got {short_text(value)}")
