"""Collapsing hits by a keyword field: one hit per value (the best of its documents), with the group's next best
documents as inner hits, like Elasticsearch's collapse and Qdrant's search groups.

    {"group_by": {"field": "source", "size": 3}}

A document without the field stands alone (its group has no value and no other member). A document with several
values joins the group of the first in sorted order. Groups form among the ranked candidates (hybrid: the top
`depth` of each retriever), so raise `depth` to fill deeper pages of groups.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hybrid_retrieval.common.errors import SpecError
from hybrid_retrieval.search import checks
from hybrid_retrieval.search.filters.columns import KeywordColumn, MetadataColumns
from hybrid_retrieval.search.filters.types import short_text
from hybrid_retrieval.search.ranking import Ranking

MAX_GROUP_SIZE = 20
GROUP_BY_FIELDS = ("field", "size")


@dataclass(frozen=True)
class GroupBy:
    field: str
    size: int = 1  # documents a group shows, its best first


@dataclass(frozen=True)
class Groups:
    """For each group, by the position of its best document in the grouped ranking: its value and members."""

    values: list[str | None]
    members: list[Ranking]  # the group's best `size` documents, best first (the group's hit first)


def check_group_by(value: object, metadata: MetadataColumns | None, path: str = "group_by") -> GroupBy | None:
    """A request's `group_by`, checked against the index's keyword fields (SpecError naming the part that is wrong)."""
    if value is None:
        return None
    if not isinstance(value, dict) or "field" not in value:
        raise SpecError(path, f'must be an object such as {{"field": "source", "size": 3}}, got {short_text(value)}')
    for name in value:
        if name not in GROUP_BY_FIELDS:
            raise SpecError(f"{path}.{name}", f"unknown; valid: {', '.join(GROUP_BY_FIELDS)}")
    keywords = [] if metadata is None else [n for n in metadata.filterable if isinstance(metadata.columns[n], KeywordColumn)]
    if value["field"] not in keywords:
        known = ", ".join(keywords) or "none"
        raise SpecError(f"{path}.field", f"{short_text(value['field'])} is not a filterable keyword field; keyword fields: {known}")
    size = checks.number(f"{path}.size", value.get("size", 1), 1, MAX_GROUP_SIZE, integer=True)
    return GroupBy(value["field"], size)


def group(ranking: Ranking, column: KeywordColumn, size: int) -> tuple[Ranking, Groups]:
    """(one hit per group, in `ranking`'s order: each group's best document with its score; the groups)."""
    starts, stops = column.offsets[ranking.doc_idx], column.offsets[ranking.doc_idx + 1]
    # sorted vocabulary ids: a document's first value in sorted order is its smallest id
    keys = [int(column.value_ids[a:b].min()) if b > a else None for a, b in zip(starts, stops)]
    positions: dict[int, list[int]] = {}
    leaders: list[int] = []
    for position, key in enumerate(keys):
        if key is None:
            leaders.append(position)
            continue
        members = positions.setdefault(key, [])
        if not members:
            leaders.append(position)
        members.append(position)
    values, grouped = [], []
    for position in leaders:
        key = keys[position]
        at = np.asarray(positions[key][:size] if key is not None else [position], dtype=np.int64)
        values.append(column.vocab[key] if key is not None else None)
        grouped.append(Ranking(ranking.doc_idx[at], ranking.scores[at]))
    chosen = np.asarray(leaders, dtype=np.int64)
    return Ranking(ranking.doc_idx[chosen], ranking.scores[chosen]), Groups(values, grouped)
