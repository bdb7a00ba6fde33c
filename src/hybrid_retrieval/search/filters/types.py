"""Metadata field types: the type each value gives its field, the type a field takes from its values, and the checks
a value written later to a collection passes.

Field types (inferred from the corpus; `hybrid index --filterable a,b` restricts which are indexed):
    keyword  strings, and lists of strings (multi-valued: a condition holds when any value satisfies it)
    bool     true / false
    int      integers;  float: numbers (a field with any fraction is float)
    date     ISO-8601 strings ("2015-03-01", "2015-03-01T10:00:00Z"; a time without an offset is UTC)
A field whose values mix types (or holds objects, or lists of non-strings) is kept in the documents but
is not filterable; the manifest says why.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from typing import Any, cast

from hybrid_retrieval.common.errors import Loc, SpecError

FIELD_TYPES = ("keyword", "bool", "int", "float", "date")
_INT64 = 2**63


def parse_date(text: object) -> float | None:
    """Seconds since the epoch of an ISO-8601 date or date-time (naive means UTC), or None."""
    if not isinstance(text, str) or len(text) < 10 or not (text[:4].isdigit() and text[4] == "-" and text[7] == "-"):
        return None
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00") if text.endswith("Z") else text)
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.timestamp()


def kind_of(value: object) -> str | None:
    """The type one metadata value would give its field; None for a missing value (null, [])."""
    if value is None or value == []:
        return None
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        if -_INT64 <= value < _INT64:
            return "int"
        try:
            float(value)
        except OverflowError:
            return "non-finite number"
        return "float"
    if isinstance(value, float):
        return "float" if math.isfinite(value) else "non-finite number"
    if isinstance(value, str):
        return "date" if parse_date(value) is not None else "keyword"
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "keywords"
    return "list" if isinstance(value, list) else type(value).__name__


# The value kinds (`kind_of`) each field type takes, in the order types are tried when inferring one.
KINDS_OF_TYPE = {"bool": {"bool"}, "int": {"int"}, "float": {"int", "float"}, "date": {"date"}, "keyword": {"keyword", "keywords", "date"}}


def field_type_of(kinds: set[str]) -> str | None:
    """The filterable type of a field whose values have `kinds`, or None when they do not share one."""
    for field_type, allowed in KINDS_OF_TYPE.items():
        if kinds <= allowed:
            return field_type
    return None


@dataclass(frozen=True)
class FieldInfo:
    """A metadata field of the corpus: its type (one of FIELD_TYPES) when filterable, else why not."""

    type: str | None
    documents: int  # documents with a value
    distinct: int | None = None  # keyword: distinct values
    reason: str | None = None  # not filterable: why

    @property
    def filterable(self) -> bool:
        return self.type is not None

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None or k == "type"}


def written_value(field_type: str | None, value: object, path: Loc) -> tuple[object, str | None]:
    """A metadata value a write gives a field, as the index stores it, and its kind (None: no value): SpecError when
    no field could hold it (a number beyond float range, a string that is not valid Unicode, an object), or when the
    field's type (`field_type`, if decided) cannot. An integer beyond 64 bits becomes a float."""
    if isinstance(value, int) and not isinstance(value, bool) and not -_INT64 <= value < _INT64:
        try:
            value = float(value)
        except OverflowError:
            raise SpecError(path, "a number beyond the range of a 64-bit float") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise SpecError(path, "must be a finite number")
    for text in value if isinstance(value, list) else [value]:
        if isinstance(text, str) and not encodable(text):
            raise SpecError(path, "not valid Unicode (a lone surrogate such as \\ud800)")
    kind = kind_of(value)
    if kind is None:
        return value, None
    if field_type_of({kind}) is None:
        raise SpecError(
            path, f"unsupported value {short_text(value)}: metadata values are strings, numbers, true/false, lists of strings or null"
        )
    if field_type is not None and kind not in KINDS_OF_TYPE[field_type]:
        raise SpecError(path, f"the field is {field_type} in this collection; got {short_text(value)}")
    return value, kind


def type_of_kind(kind: str) -> str:
    """The type a field gets from its first value of `kind` (a field a write adds to a collection)."""
    return cast(str, field_type_of({kind}))  # a kind written_value admits: some type takes it


def encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def short_text(value: object) -> str:
    """A value as an error message quotes it: its JSON text, cut to 60 characters."""
    try:
        text = json.dumps(value, allow_nan=False)
    except (ValueError, TypeError, RecursionError):  # NaN, a huge integer's text, or something JSON cannot hold
        text = repr(value) if not isinstance(value, int) or abs(value) < 10**60 else "an integer of over 60 digits"
    return text if len(text) <= 60 else text[:57] + "..."
