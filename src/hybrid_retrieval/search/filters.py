"""Metadata filters: typed columns built at index time, and a MongoDB-style filter language over them.

Field types (inferred from the corpus; `hybrid index --filterable a,b` restricts which are indexed):
    keyword  strings, and lists of strings (multi-valued: a condition holds when any value satisfies it)
    bool     true / false
    int      integers;  float: numbers (a field with any fraction is float)
    date     ISO-8601 strings ("2015-03-01", "2015-03-01T10:00:00Z"; a time without an offset is UTC)
A field whose values mix types (or holds objects, or lists of non-strings) is kept in the documents but
is not filterable; the manifest says why.

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

import bisect
import json
import math
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from functools import cached_property
from pathlib import Path

import numpy as np

from hybrid_retrieval.search.errors import ConfigError, Loc, SpecError

FIELD_TYPES = ("keyword", "bool", "int", "float", "date")
OPERATORS = ("eq", "ne", "in", "nin", "gt", "gte", "lt", "lte", "exists")
RANGES = ("gt", "gte", "lt", "lte")
LOGICAL = ("$and", "$or", "$not")
FACET_TYPES = ("keyword", "bool", "int")
MAX_FILTER_DEPTH = 16
MAX_LIST_VALUES = 1024
METADATA_DIR = "metadata"
_INT64 = 2**63


def parse_date(text: str) -> float | None:
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


def _kind(value) -> str | None:
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


# The value kinds (`_kind`) each field type takes, in the order types are tried when inferring one.
_KINDS_OF_TYPE = {"bool": {"bool"}, "int": {"int"}, "float": {"int", "float"}, "date": {"date"},
                  "keyword": {"keyword", "keywords", "date"}}


def _field_type(kinds: set[str]) -> str | None:
    """The filterable type of a field whose values have `kinds`, or None when they do not share one."""
    for field_type, allowed in _KINDS_OF_TYPE.items():
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

    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None or k == "type"}


class KeywordColumn:
    """Values of a keyword field as CSR rows: document i has value ids value_ids[offsets[i]:offsets[i+1]],
    ids into a sorted vocabulary (so a lexicographic range is a range of ids)."""

    def __init__(self, vocab: list[str], offsets: np.ndarray, value_ids: np.ndarray):
        self.vocab, self.offsets, self.value_ids = vocab, offsets, value_ids
        self._id = {v: i for i, v in enumerate(vocab)}
        self.entry_doc = np.repeat(np.arange(len(offsets) - 1, dtype=np.int64), np.diff(offsets))

    @property
    def present(self) -> np.ndarray:
        return np.diff(self.offsets) > 0

    def take(self, docs: np.ndarray) -> "KeywordColumn":
        """The rows of `docs` (in that order), over the same vocabulary."""
        starts, stops = self.offsets[docs], self.offsets[np.asarray(docs) + 1]
        entries = np.concatenate([np.arange(a, b) for a, b in zip(starts, stops)]) if len(docs) else np.empty(0, np.int64)
        offsets = np.concatenate([[0], np.cumsum(stops - starts)]).astype(np.int64)
        return KeywordColumn(self.vocab, offsets, self.value_ids[entries.astype(np.int64)])

    def _docs_where(self, entry_hit: np.ndarray) -> np.ndarray:
        mask = np.zeros(len(self.offsets) - 1, dtype=bool)
        mask[self.entry_doc[entry_hit]] = True
        return mask

    def any_of(self, values: Iterable[str]) -> np.ndarray:
        ids = [self._id[v] for v in values if v in self._id]
        if not ids:
            return np.zeros(len(self.offsets) - 1, dtype=bool)
        hit = self.value_ids == ids[0] if len(ids) == 1 else np.isin(self.value_ids, ids)
        return self._docs_where(hit)

    def in_range(self, low: str | None, low_inclusive: bool, high: str | None, high_inclusive: bool) -> np.ndarray:
        first = 0 if low is None else (bisect.bisect_left if low_inclusive else bisect.bisect_right)(self.vocab, low)
        stop = len(self.vocab) if high is None else (bisect.bisect_right if high_inclusive else bisect.bisect_left)(self.vocab, high)
        return self._docs_where((self.value_ids >= first) & (self.value_ids < stop))

    def counts(self, docs: np.ndarray) -> list[tuple[str, int]]:
        selected = np.zeros(len(self.offsets) - 1, dtype=bool)
        selected[docs] = True
        counts = np.bincount(self.value_ids[selected[self.entry_doc]], minlength=len(self.vocab))
        return [(self.vocab[i], int(counts[i])) for i in np.flatnonzero(counts)]


class ValueColumn:
    """One value per document (bool, int, float, date as epoch seconds) and whether it has one."""

    def __init__(self, values: np.ndarray, present: np.ndarray):
        self.values, self.present = values, present

    def any_of(self, values: Sequence) -> np.ndarray:
        return self.present & np.isin(self.values, np.asarray(values))  # no cast: 1999.5 must not match an int 1999

    def in_range(self, low, low_inclusive: bool, high, high_inclusive: bool) -> np.ndarray:
        mask = self.present.copy()
        if low is not None:
            mask &= (self.values >= low) if low_inclusive else (self.values > low)
        if high is not None:
            mask &= (self.values <= high) if high_inclusive else (self.values < high)
        return mask

    def take(self, docs: np.ndarray) -> "ValueColumn":
        return ValueColumn(self.values[docs], self.present[docs])

    def counts(self, docs: np.ndarray) -> list[tuple, int]:
        values = self.values[docs][self.present[docs]]
        unique, counts = np.unique(values, return_counts=True)
        return [(v.item(), int(c)) for v, c in zip(unique, counts)]


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


class MetadataColumns:
    """The filterable fields of an index, loaded once; evaluates filters to `Allowed` sets."""

    def __init__(self, fields: dict[str, FieldInfo], columns: dict[str, KeywordColumn | ValueColumn], num_docs: int):
        self.fields, self.columns, self.num_docs = fields, columns, num_docs
        self._cache: OrderedDict[str, Allowed] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def filterable(self) -> list[str]:
        return sorted(self.columns)

    def allowed(self, filter_: dict) -> Allowed:
        """The documents `filter_` admits; SpecError naming the path inside the filter when it is invalid.
        Recent answers are cached (a batch, an evaluation or a paging user repeats the same filter)."""
        try:
            key = json.dumps(filter_, sort_keys=True)
        except (ValueError, TypeError):  # no JSON text (an integer of thousands of digits): the evaluation says why
            key = None
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        allowed = Allowed(self._evaluate(filter_, ("filter",), 0))
        with self._lock:
            self._cache[key] = allowed
            if len(self._cache) > 64:
                self._cache.popitem(last=False)
        return allowed

    def _evaluate(self, node, path: Loc, depth: int) -> np.ndarray:
        if not isinstance(node, dict):
            raise SpecError(path, f"a filter is an object of field conditions and $and/$or/$not, got {_short(node)}")
        if depth > MAX_FILTER_DEPTH:
            raise SpecError(path, f"filters nest at most {MAX_FILTER_DEPTH} levels deep")
        mask = np.ones(self.num_docs, dtype=bool)
        for key, value in node.items():
            where = (*path, key)
            if key in ("$and", "$or"):
                if not isinstance(value, list) or not value:
                    raise SpecError(where, f"must be a non-empty list of filters, got {_short(value)}")
                parts = [self._evaluate(item, (*where, i), depth + 1) for i, item in enumerate(value)]
                mask &= np.logical_and.reduce(parts) if key == "$and" else np.logical_or.reduce(parts)
            elif key == "$not":
                mask &= ~self._evaluate(value, where, depth + 1)
            elif key.startswith("$"):
                raise SpecError(where, f"unknown logical operator; valid: {', '.join(LOGICAL)}")
            else:
                mask &= self._condition(key, value, where)
        return mask

    def _condition(self, name: str, condition, path: Loc) -> np.ndarray:
        column = self.columns.get(name)
        if column is None:
            info = self.fields.get(name)
            why = f"is not filterable ({info.reason})" if info is not None and info.reason else "unknown field"
            raise SpecError(path, f"{why}; filterable fields: {', '.join(self.filterable) or 'none (this index has no metadata)'}")
        field_type = self.fields[name].type
        if isinstance(condition, list):
            raise SpecError(path, f"a list is not a value; to match any of several, use {{\"in\": {_short(condition)}}}")
        if condition is None:
            raise SpecError(path, "null is not a value; to match documents without the field, use {\"exists\": false}")
        shorthand = not isinstance(condition, dict)
        if shorthand:
            condition = {"eq": condition}
        if not condition:
            raise SpecError(path, f"an empty condition; operators: {', '.join(OPERATORS)}")
        mask = np.ones(self.num_docs, dtype=bool)
        for raw_op, operand in condition.items():
            op = raw_op[1:] if isinstance(raw_op, str) and raw_op.startswith("$") else raw_op
            where = path if shorthand else (*path, raw_op)
            if op not in OPERATORS:
                raise SpecError(where, f"unknown operator; valid: {', '.join(OPERATORS)}")
            if op == "exists":
                if not isinstance(operand, bool):
                    raise SpecError(where, f"must be true or false, got {_short(operand)}")
                mask &= column.present if operand else ~column.present
            elif op in ("eq", "ne"):
                hit = column.any_of([_operand(field_type, operand, where)])
                mask &= hit if op == "eq" else ~hit
            elif op in ("in", "nin"):
                if not isinstance(operand, list) or len(operand) > MAX_LIST_VALUES:
                    raise SpecError(where, f"must be a list of at most {MAX_LIST_VALUES} values, got {_short(operand)}")
                hit = column.any_of([_operand(field_type, v, (*where, i)) for i, v in enumerate(operand)])
                mask &= hit if op == "in" else ~hit
            else:
                if field_type == "bool":
                    raise SpecError(where, f"range operators apply to int, float, date and keyword fields; {name!r} is bool")
                bound = _operand(field_type, operand, where)
                low, high = (bound, None) if op in ("gt", "gte") else (None, bound)
                mask &= column.in_range(low, op == "gte", high, op == "lte")
        return mask

    def facets(self, names: Sequence[str], docs: np.ndarray, size: int) -> dict[str, list[dict]]:
        """For each field, its `size` most frequent values among `docs` (count, then value order)."""
        out = {}
        for name in names:
            pairs = self.columns[name].counts(docs)
            pairs.sort(key=lambda pair: -pair[1])  # stable: equal counts keep value order
            out[name] = [{"value": value, "count": count} for value, count in pairs[:size]]
        return out

    def take(self, docs: np.ndarray) -> "MetadataColumns":
        """The columns of `docs` (in that order): a shard's (indexer.shards)."""
        return MetadataColumns(self.fields, {name: column.take(docs) for name, column in self.columns.items()}, len(docs))

    def check_facets(self, names, path: str = "facets") -> list[str]:
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise SpecError(path, f"must be a list of field names, got {_short(names)}")
        valid = [n for n in self.filterable if self.fields[n].type in FACET_TYPES]
        for i, name in enumerate(names):
            if name not in valid:
                raise SpecError(f"{path}[{i}]", f"{name!r} cannot be counted; facet fields (keyword, bool, int): {', '.join(valid) or 'none'}")
        return names

    # Storage: metadata/<i>.<part>.npy per filterable field, in the order of `fields` in the manifest.

    def save(self, folder: Path) -> None:
        if not self.columns:
            return
        where = folder / METADATA_DIR
        where.mkdir()
        for i, name in enumerate(self.filterable):
            column = self.columns[name]
            if isinstance(column, KeywordColumn):
                (where / f"{i}.vocab.json").write_text(json.dumps(column.vocab, ensure_ascii=False))
                np.save(where / f"{i}.offsets.npy", column.offsets)
                np.save(where / f"{i}.values.npy", column.value_ids)
            else:
                np.save(where / f"{i}.values.npy", column.values)
                np.save(where / f"{i}.present.npy", column.present)

    @classmethod
    def load(cls, folder: Path, fields: dict[str, FieldInfo], num_docs: int) -> "MetadataColumns":
        where = folder / METADATA_DIR
        columns: dict[str, KeywordColumn | ValueColumn] = {}
        for i, name in enumerate(sorted(n for n, info in fields.items() if info.filterable)):
            if fields[name].type == "keyword":
                columns[name] = KeywordColumn(json.loads((where / f"{i}.vocab.json").read_text()),
                                              np.load(where / f"{i}.offsets.npy"), np.load(where / f"{i}.values.npy"))
            else:
                columns[name] = ValueColumn(np.load(where / f"{i}.values.npy"), np.load(where / f"{i}.present.npy"))
        return cls(fields, columns, num_docs)


def _operand(field_type: str, value, path: Loc):
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
        expected = "an ISO-8601 date such as \"2015-03-01\" or \"2015-03-01T10:00:00Z\""
    else:
        if not isinstance(value, bool) and isinstance(value, (int, float)):
            try:
                if math.isfinite(value):
                    return value
            except OverflowError:  # an integer beyond float range
                pass
        expected = "a finite number"
    raise SpecError(path, f"must be {expected} ({field_type} field), got {_short(value)}")


def _short(value) -> str:
    try:
        text = json.dumps(value, allow_nan=False)
    except (ValueError, TypeError, RecursionError):  # NaN, a huge integer's text, or something JSON cannot hold
        text = repr(value) if not isinstance(value, int) or abs(value) < 10**60 else "an integer of over 60 digits"
    return text if len(text) <= 60 else text[:57] + "..."


class MetadataCollector:
    """Collects each document's metadata during a build, then infers field types and builds the columns.

    `only` restricts the filterable fields (`hybrid index --filterable`); naming a field the corpus does
    not have, or one whose values share no type, is an error.
    """

    def __init__(self, only: Sequence[str] | None = None, types: dict[str, str] | None = None):
        self.only = None if only is None else list(dict.fromkeys(only))
        self.types = types or {}  # fields whose type is already decided (a live segment follows its base's)
        self._values: dict[str, list[tuple[int, object]]] = {}
        self._kinds: dict[str, set[str]] = {}
        self.num_docs = 0

    def add(self, metadata: dict) -> None:
        doc = self.num_docs
        self.num_docs += 1
        for name, value in metadata.items():
            kind = _kind(value)
            if kind is None:
                continue
            self._kinds.setdefault(name, set()).add(kind)
            if self.only is None or name in self.only:
                self._values.setdefault(name, []).append((doc, value))

    def finish(self) -> MetadataColumns:
        fields: dict[str, FieldInfo] = {}
        columns: dict[str, KeywordColumn | ValueColumn] = {}
        for name in sorted(self._kinds):
            kinds, values = self._kinds[name], self._values.get(name)
            documents = len({doc for doc, _ in values}) if values else 0
            given = self.types.get(name)
            field_type = given if given is not None and kinds <= _KINDS_OF_TYPE[given] else _field_type(kinds)
            if name.startswith("$"):
                fields[name] = FieldInfo(None, documents, reason="a name starting with $ is reserved for $and, $or, $not")
            elif field_type is None:
                fields[name] = FieldInfo(None, documents, reason=f"values of several types ({', '.join(sorted(kinds))})")
            elif values is None:
                fields[name] = FieldInfo(None, 0, reason="not listed in --filterable")
            else:
                columns[name] = self._column(field_type, values)
                distinct = len(columns[name].vocab) if field_type == "keyword" else None
                fields[name] = FieldInfo(field_type, len(values), distinct)
        if self.only is not None:
            for name in self.only:
                if name not in fields:
                    raise ConfigError(f"--filterable names {name!r}, which no document has; fields: {', '.join(fields) or 'none'}")
                if not fields[name].filterable:
                    raise ConfigError(f"--filterable names {name!r}, which cannot be filtered: {fields[name].reason}")
        return MetadataColumns(fields, columns, self.num_docs)

    def empty_column(self, field_type: str) -> KeywordColumn | ValueColumn:
        """A column of `field_type` in which none of the documents has a value."""
        return self._column(field_type, [])

    def _column(self, field_type: str, values: list[tuple[int, object]]) -> KeywordColumn | ValueColumn:
        n = self.num_docs
        if field_type == "keyword":
            rows = [(doc, value if isinstance(value, list) else [value]) for doc, value in values]
            vocab = sorted({v for _, row in rows for v in row})
            ids = {v: i for i, v in enumerate(vocab)}
            lengths = np.zeros(n, dtype=np.int64)
            for doc, row in rows:
                lengths[doc] = len(dict.fromkeys(row))
            offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
            value_ids = np.fromiter((ids[v] for _, row in rows for v in dict.fromkeys(row)), dtype=np.int32, count=int(offsets[-1]))
            return KeywordColumn(vocab, offsets, value_ids)
        dtype = {"bool": np.bool_, "int": np.int64, "float": np.float64, "date": np.float64}[field_type]
        column, present = np.zeros(n, dtype=dtype), np.zeros(n, dtype=bool)
        for doc, value in values:
            column[doc] = parse_date(value) if field_type == "date" else value
            present[doc] = True
        return ValueColumn(column, present)


def written_value(field_type: str | None, value, path: Loc) -> tuple[object, str | None]:
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
    for text in (value if isinstance(value, list) else [value]):
        if isinstance(text, str) and not encodable(text):
            raise SpecError(path, "not valid Unicode (a lone surrogate such as \\ud800)")
    kind = _kind(value)
    if kind is None:
        return value, None
    if _field_type({kind}) is None:
        raise SpecError(path, f"unsupported value {_short(value)}: metadata values are strings, numbers, true/false, "
                              "lists of strings or null")
    if field_type is not None and kind not in _KINDS_OF_TYPE[field_type]:
        raise SpecError(path, f"the field is {field_type} in this collection; got {_short(value)}")
    return value, kind


def type_of_kind(kind: str) -> str:
    """The type a field gets from its first value of `kind` (a field a write adds to a collection)."""
    return _field_type({kind})


def encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_filter(value) -> dict | None:
    """A request's filter before the index checks its fields: a JSON object (an empty one: no filter)."""
    if value is None or value == {}:
        return None
    if not isinstance(value, dict):
        raise SpecError("filter", f"must be an object such as {{\"year\": {{\"gte\": 2015}}}}, got {_short(value)}")
    return value
