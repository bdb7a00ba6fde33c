"""Sorting hits by metadata fields instead of by score: `"sort": ["price", {"field": "published", "order": "desc"}]`.

Keys apply in order; a field's documents without a value come last in either order; `_score` (descending unless
said) is the final score as a key, and breaks the ties every sort leaves (then the lower position, as everywhere).
A keyword field with several values sorts by its smallest value ascending and its largest descending, as
Elasticsearch does.

What is sorted is the ranked candidates (hybrid: the fused top `depth` of each leg; one retriever: its top `depth`),
not the whole collection: the query decides which documents are relevant, the sort only their order. Sorting every
document would put the cheapest item of the catalogue first whatever was asked, and a dense leg scores every
document, so "every matching document" is the collection; to list a whole filtered set by a field, raise `depth`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from hybrid_retrieval.common.errors import SpecError
from hybrid_retrieval.search import checks
from hybrid_retrieval.search.filters.columns import KeywordColumn, MetadataColumns
from hybrid_retrieval.search.filters.types import short_text
from hybrid_retrieval.search.ranking import Ranking

SCORE = "_score"
ORDERS = ("asc", "desc")
MAX_SORT_KEYS = 8
SORT_TYPES = ("keyword", "bool", "int", "float", "date")


@dataclass(frozen=True)
class SortKey:
    field: str  # a filterable field, or _score
    order: str = "asc"

    def to_dict(self) -> dict[str, str]:
        return {"field": self.field, "order": self.order}


def check_sort(value: object) -> tuple[SortKey, ...]:
    """A request's `sort`: a list of field names ("price", "price:desc") or {"field": F, "order": "asc"|"desc"}."""
    if value is None:
        return ()
    if isinstance(value, tuple) and all(isinstance(key, SortKey) for key in value):
        return value
    if not isinstance(value, list):
        raise SpecError("sort", f'must be a list such as ["price", {{"field": "published", "order": "desc"}}], got {short_text(value)}')
    if len(value) > MAX_SORT_KEYS:
        raise SpecError("sort", f"at most {MAX_SORT_KEYS} keys, got {len(value)}")
    keys = []
    for i, item in enumerate(value):
        path = f"sort[{i}]"
        if isinstance(item, str):
            name, _, order = item.rpartition(":") if item.endswith((":asc", ":desc")) else (item, "", "")
            item = {"field": name} | ({"order": order} if order else {})
        if not isinstance(item, dict) or not isinstance(item.get("field"), str) or not item["field"]:
            raise SpecError(path, f'must be a field name or {{"field": F, "order": "asc"|"desc"}}, got {short_text(item)}')
        for key in item:
            if key not in ("field", "order"):
                raise SpecError(f"{path}.{key}", "unknown field; valid: field, order")
        default = "desc" if item["field"] == SCORE else "asc"
        keys.append(SortKey(item["field"], checks.choice(f"{path}.order", item.get("order", default), ORDERS)))
    return tuple(keys)


def check_sort_fields(keys: tuple[SortKey, ...], metadata: MetadataColumns | None) -> None:
    for i, key in enumerate(keys):
        if key.field == SCORE:
            continue
        if metadata is None or key.field not in metadata.columns:
            known = ", ".join([SCORE, *(metadata.filterable if metadata is not None else [])])
            raise SpecError(("sort", i, "field"), f"{short_text(key.field)} is not a filterable field; sortable: {known}")


def sort_keys(key: SortKey, docs: np.ndarray, scores: np.ndarray, metadata: MetadataColumns | None) -> tuple[np.ndarray, np.ndarray]:
    """(missing, value) of `docs` for one key, both ascending-is-first: a descending key's values are negated."""
    sign = -1.0 if key.order == "desc" else 1.0
    if key.field == SCORE:
        return np.zeros(len(docs), dtype=bool), sign * scores.astype(np.float64)
    assert metadata is not None  # check_sort_fields
    column = metadata.columns[key.field]
    if isinstance(column, KeywordColumn):  # vocabulary ids are in value order
        starts, stops = column.offsets[docs], column.offsets[docs + 1]
        present = stops > starts
        pick = np.minimum if key.order == "asc" else np.maximum
        values = np.zeros(len(docs), dtype=np.float64)
        values[present] = column.value_ids[starts[present]]
        for i in np.flatnonzero(stops - starts > 1):  # several values: the smallest or the largest
            values[i] = pick.reduce(column.value_ids[starts[i] : stops[i]])
        return ~present, sign * values
    present = column.present[docs]
    return ~present, sign * np.where(present, column.values[docs].astype(np.float64), 0.0)


def sort_ranking(ranking: Ranking, keys: tuple[SortKey, ...], metadata: MetadataColumns | None, rows: np.ndarray) -> Ranking:
    """`ranking` ordered by `keys`, then score descending, then position; `rows`: its documents' rows in `metadata`."""
    docs, scores = ranking.doc_idx, ranking.scores
    columns: list[np.ndarray] = [docs, -scores.astype(np.float64)]  # np.lexsort: the last key is the primary one
    for key in reversed(keys):
        missing, values = sort_keys(key, rows, scores, metadata)
        columns += [values, missing]
    order = np.lexsort(columns)
    return Ranking(docs[order], scores[order])


def sort_to_list(keys: tuple[SortKey, ...]) -> list[dict[str, Any]]:
    return [key.to_dict() for key in keys]
