"""The filterable metadata of an index as columns: one per filterable field, built from the corpus at index time
(MetadataCollector, which infers the fields' types: search.filters.types), stored in the index folder, evaluated
against filters (search.filters.language) and counted for facets.

Storage: metadata/<i>.<part>.npy per filterable field, in the order of `fields` in the manifest.
"""

from __future__ import annotations

import bisect
import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import cast

import numpy as np

from hybrid_retrieval.common.errors import ConfigError, SpecError
from hybrid_retrieval.search.filters.language import Allowed, evaluate
from hybrid_retrieval.search.filters.types import KINDS_OF_TYPE, FieldInfo, field_type_of, kind_of, parse_date, short_text

FACET_TYPES = ("keyword", "bool", "int")
METADATA_DIR = "metadata"


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

    def take(self, docs: np.ndarray) -> KeywordColumn:
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

    def any_of(self, values: Sequence[bool | int | float]) -> np.ndarray:
        return self.present & np.isin(self.values, np.asarray(values))  # no cast: 1999.5 must not match an int 1999

    def in_range(self, low: float | None, low_inclusive: bool, high: float | None, high_inclusive: bool) -> np.ndarray:
        mask = self.present.copy()
        if low is not None:
            mask &= (self.values >= low) if low_inclusive else (self.values > low)
        if high is not None:
            mask &= (self.values <= high) if high_inclusive else (self.values < high)
        return mask

    def take(self, docs: np.ndarray) -> ValueColumn:
        return ValueColumn(self.values[docs], self.present[docs])

    def counts(self, docs: np.ndarray) -> list[tuple[bool | int | float, int]]:
        values = self.values[docs][self.present[docs]]
        unique, counts = np.unique(values, return_counts=True)
        return [(v.item(), int(c)) for v, c in zip(unique, counts)]


class MetadataColumns:
    """The filterable fields of an index, loaded once; evaluates filters to `Allowed` sets."""

    def __init__(self, fields: dict[str, FieldInfo], columns: dict[str, KeywordColumn | ValueColumn], num_docs: int):
        self.fields, self.columns, self.num_docs = fields, columns, num_docs
        self._cache: OrderedDict[str | None, Allowed] = OrderedDict()  # by the filter's JSON text
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
        allowed = Allowed(evaluate(self, filter_))
        with self._lock:
            self._cache[key] = allowed
            if len(self._cache) > 64:
                self._cache.popitem(last=False)
        return allowed

    def facets(self, names: Sequence[str], docs: np.ndarray, size: int) -> dict[str, list[dict]]:
        """For each field, its `size` most frequent values among `docs` (count, then value order)."""
        out = {}
        for name in names:
            pairs = self.columns[name].counts(docs)
            pairs.sort(key=lambda pair: -pair[1])  # stable: equal counts keep value order
            out[name] = [{"value": value, "count": count} for value, count in pairs[:size]]
        return out

    def for_docs(self, docs: np.ndarray) -> tuple[MetadataColumns, Callable[[np.ndarray], np.ndarray]]:
        """Columns holding `docs`' values, and each document's row in them: these columns, where documents are rows
        (a sharded index's coordinator fetches them from the shards: search.sharded)."""
        return self, lambda rows: rows

    def take(self, docs: np.ndarray) -> MetadataColumns:
        """The columns of `docs` (in that order): a shard's (indexer.shards)."""
        return MetadataColumns(self.fields, {name: column.take(docs) for name, column in self.columns.items()}, len(docs))

    def check_facets(self, names: object, path: str = "facets") -> list[str]:
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise SpecError(path, f"must be a list of field names, got {short_text(names)}")
        valid = [n for n in self.filterable if self.fields[n].type in FACET_TYPES]
        for i, name in enumerate(names):
            if name not in valid:
                raise SpecError(
                    f"{path}[{i}]", f"{name!r} cannot be counted; facet fields (keyword, bool, int): {', '.join(valid) or 'none'}"
                )
        return names

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
    def load(cls, folder: Path, fields: dict[str, FieldInfo], num_docs: int) -> MetadataColumns:
        where = folder / METADATA_DIR
        columns: dict[str, KeywordColumn | ValueColumn] = {}
        for i, name in enumerate(sorted(n for n, info in fields.items() if info.filterable)):
            if fields[name].type == "keyword":
                columns[name] = KeywordColumn(
                    json.loads((where / f"{i}.vocab.json").read_text()),
                    np.load(where / f"{i}.offsets.npy"),
                    np.load(where / f"{i}.values.npy"),
                )
            else:
                columns[name] = ValueColumn(np.load(where / f"{i}.values.npy"), np.load(where / f"{i}.present.npy"))
        return cls(fields, columns, num_docs)


def check_filterable(fields: dict[str, FieldInfo], only: Sequence[str]) -> None:
    """A corpus built offline with `--filterable`: every name it lists is a field of the corpus that can be filtered
    (a typo would otherwise leave a filter failing later). A collection declares fields before their documents come."""
    for name in only:
        if name not in fields:
            raise ConfigError(f"--filterable names {name!r}, which no document has; fields: {', '.join(fields) or 'none'}")
        if not fields[name].filterable:
            raise ConfigError(f"--filterable names {name!r}, which cannot be filtered: {fields[name].reason}")


RESERVED = "a name starting with $ is reserved for $and, $or, $not"


class MetadataCollector:
    """Collects each document's metadata during a build, then infers field types and builds the columns.

    `only` restricts the filterable fields (`hybrid index --filterable`); naming a field the corpus does
    not have, or one whose values share no type, is an error.
    """

    def __init__(
        self, only: Sequence[str] | None = None, types: dict[str, str] | None = None, decided: dict[str, str | None] | None = None
    ):
        self.only = None if only is None else list(dict.fromkeys(only))
        self.types = types or {}  # fields whose type is already decided (a live segment follows its base's)
        # a compaction's: every field its collection decided (None: not filterable), kept as it is even when no
        # document holds it any more, so that the writes logged meanwhile, checked against them, still apply
        self.decided = decided or {}
        self._values: dict[str, list[tuple[int, object]]] = {}
        self._kinds: dict[str, set[str]] = {}
        self.num_docs = 0

    def add(self, metadata: dict) -> None:
        doc = self.num_docs
        self.num_docs += 1
        for name, value in metadata.items():
            kind = kind_of(value)
            if kind is None:
                continue
            self._kinds.setdefault(name, set()).add(kind)
            if self.only is None or name in self.only:
                self._values.setdefault(name, []).append((doc, value))

    def finish(self) -> MetadataColumns:
        fields: dict[str, FieldInfo] = {}
        columns: dict[str, KeywordColumn | ValueColumn] = {}
        for name in sorted(set(self._kinds) | set(self.decided)):
            kinds, values = self._kinds.get(name, set()), self._values.get(name)
            documents = len({doc for doc, _ in values}) if values else 0
            if name in self.decided:
                decided = self.decided[name]
                if decided is None:
                    fields[name] = FieldInfo(None, documents, reason=self._unfilterable(name))
                else:
                    columns[name] = column = self._column(decided, values or [])
                    fields[name] = FieldInfo(decided, len(values or []), len(column.vocab) if isinstance(column, KeywordColumn) else None)
                continue
            given = self.types.get(name)
            field_type = given if given is not None and kinds <= KINDS_OF_TYPE[given] else field_type_of(kinds)
            if name.startswith("$"):
                fields[name] = FieldInfo(None, documents, reason=RESERVED)
            elif field_type is None:
                fields[name] = FieldInfo(None, documents, reason=f"values of several types ({', '.join(sorted(kinds))})")
            elif values is None:
                fields[name] = FieldInfo(None, 0, reason="not listed in --filterable")
            else:
                columns[name] = column = self._column(field_type, values)
                distinct = len(column.vocab) if isinstance(column, KeywordColumn) else None
                fields[name] = FieldInfo(field_type, len(values), distinct)
        return MetadataColumns(fields, columns, self.num_docs)

    def _unfilterable(self, name: str) -> str:
        """Why a field its collection decided is not filterable (its values then are long gone)."""
        if name.startswith("$"):
            return RESERVED
        if self.only is not None and name not in self.only:
            return "not listed in --filterable"
        return "values of several types in this collection"

    def empty_column(self, field_type: str) -> KeywordColumn | ValueColumn:
        """A column of `field_type` in which none of the documents has a value."""
        return self._column(field_type, [])

    def _column(self, field_type: str, values: list[tuple[int, object]]) -> KeywordColumn | ValueColumn:
        n = self.num_docs
        if field_type == "keyword":
            # a keyword field's values are strings and lists of strings (KINDS_OF_TYPE)
            rows = [(doc, cast("list[str]", value if isinstance(value, list) else [value])) for doc, value in values]
            vocab = sorted({v for _, row in rows for v in row})
            ids = {v: i for i, v in enumerate(vocab)}
            lengths = np.zeros(n, dtype=np.int64)
            for doc, row in rows:
                lengths[doc] = len(dict.fromkeys(row))
            offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
            value_ids = np.fromiter((ids[v] for _, row in rows for v in dict.fromkeys(row)), dtype=np.int32, count=int(offsets[-1]))
            return KeywordColumn(vocab, offsets, value_ids)
        dtype = {"bool": np.bool_, "int": np.int64, "float": np.float64, "date": np.float64}[field_type]
        column: np.ndarray
        column, present = np.zeros(n, dtype=dtype), np.zeros(n, dtype=bool)
        for doc, value in values:
            column[doc] = parse_date(value) if field_type == "date" else value
            present[doc] = True
        return ValueColumn(column, present)
