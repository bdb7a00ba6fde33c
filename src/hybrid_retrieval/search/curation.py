"""Curation: documents an editor puts first (`pinned`, in the given order) or never shows (`hidden`), per request and
as a collection's rules keyed by a query:

    {"query": "iphone", "pinned": ["sku-15", "sku-14"], "hidden": ["sku-recalled"]}
    rule: {"query": "iphone", "match": "exact" | "contains", "pinned": [...], "hidden": [...]}

A hidden document is left out before retrieval, as a filter would (it takes no candidate's place). A pinned one
comes first only if it exists and the request's filter admits it, then the ranking follows without it: pages
count it once, on the page its place falls in. A rule applies when the query, case and spacing aside, equals its
query (`exact`) or holds it as a run of whole words (`contains`); a request's own pins come before its rules',
and `hidden` adds up.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hybrid_retrieval.common.errors import SpecError
from hybrid_retrieval.search import checks
from hybrid_retrieval.search.filters.language import Allowed
from hybrid_retrieval.search.filters.types import short_text
from hybrid_retrieval.search.ranking import Ranking

MAX_CURATED = 100  # ids a request or rule pins or hides
MAX_RULES = 10_000
MATCHES = ("exact", "contains")
RULE_FIELDS = ("query", "match", "pinned", "hidden")


@dataclass(frozen=True)
class Curation:
    pinned: tuple[str, ...] = ()
    hidden: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.pinned or self.hidden)

    def then(self, other: Curation) -> Curation:
        """This curation's pins, then `other`'s not already pinned; both hidden sets."""
        pinned = self.pinned + tuple(doc for doc in other.pinned if doc not in self.pinned)
        return Curation(pinned, self.hidden + tuple(doc for doc in other.hidden if doc not in self.hidden))


def check_ids(value: object, path: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, (list, tuple)) or not all(isinstance(doc, str) and doc for doc in value):
        raise SpecError(path, f"must be a list of document ids, got {short_text(value)}")
    if len(value) > MAX_CURATED:
        raise SpecError(path, f"at most {MAX_CURATED} ids, got {len(value)}")
    return tuple(dict.fromkeys(value))  # a repeated id counts once, where it first appears


def normalized(query: str) -> str:
    return " ".join(query.casefold().split())


@dataclass(frozen=True)
class CurationRule:
    query: str
    match: str = "exact"
    curation: Curation = Curation()

    def applies(self, query: str) -> bool:
        own, asked = normalized(self.query), normalized(query)
        return own == asked if self.match == "exact" else f" {own} " in f" {asked} "

    def to_dict(self) -> dict[str, Any]:
        return {"query": self.query, "match": self.match, "pinned": list(self.curation.pinned), "hidden": list(self.curation.hidden)}


def check_rules(value: object, path: str = "curation") -> list[CurationRule]:
    """A collection's curation rules from their dict forms (SpecError naming the rule and field)."""
    if not isinstance(value, list):
        raise SpecError(path, f"must be a list of rules such as {{'query': 'iphone', 'pinned': ['sku-15']}}, got {short_text(value)}")
    if len(value) > MAX_RULES:
        raise SpecError(path, f"at most {MAX_RULES} rules, got {len(value)}")
    rules = []
    for i, rule in enumerate(value):
        at = f"{path}[{i}]"
        if not isinstance(rule, dict):
            raise SpecError(at, f"must be an object with fields {', '.join(RULE_FIELDS)}, got {short_text(rule)}")
        for key in rule:
            if key not in RULE_FIELDS:
                raise SpecError(f"{at}.{key}", f"unknown field; valid: {', '.join(RULE_FIELDS)}")
        query = rule.get("query")
        if not isinstance(query, str) or not query.strip():
            raise SpecError(f"{at}.query", f"must be a non-empty query, got {short_text(query)}")
        curation = Curation(check_ids(rule.get("pinned"), f"{at}.pinned"), check_ids(rule.get("hidden"), f"{at}.hidden"))
        rules.append(CurationRule(query, checks.choice(f"{at}.match", rule.get("match", "exact"), MATCHES), curation))
    return rules


def for_query(rules: Sequence[CurationRule], query: str | None) -> Curation:
    """What the rules that apply to `query` pin and hide, in the rules' order."""
    combined = Curation()
    if query is not None:
        for rule in rules:
            if rule.applies(query):
                combined = combined.then(rule.curation)
    return combined


@dataclass(frozen=True)
class Placed:
    """A curation's documents by position: the pins that may be shown, in order; every hidden one."""

    pinned: np.ndarray
    hidden: np.ndarray

    @classmethod
    def of(cls, curation: Curation, positions_of: Callable[[Sequence[str]], list[int | None]]) -> Placed:
        """Unknown ids are left out (an editor's list may name a document deleted since)."""

        def found(ids: tuple[str, ...]) -> np.ndarray:  # each document once, where it first appears
            return np.array(list(dict.fromkeys(p for p in positions_of(ids) if p is not None)), dtype=np.int64)

        hidden = found(curation.hidden)
        pinned = found(curation.pinned)
        return cls(pinned[~np.isin(pinned, hidden)], hidden)


def without(allowed: Allowed | None, hidden: np.ndarray, num_docs: int) -> Allowed | None:
    """`allowed` (None: every document) without `hidden`."""
    if not len(hidden):
        return allowed
    mask = np.ones(num_docs, dtype=bool) if allowed is None else allowed.mask.copy()
    mask[hidden] = False
    return Allowed(mask)


def pin(ranking: Ranking, pins: np.ndarray) -> tuple[Ranking, tuple[int, ...]]:
    """(`pins` first, in order, then `ranking` without them; those pins). A pin keeps its score when it was ranked,
    else NaN (no score: it was not among the candidates)."""
    if not len(pins):
        return ranking, ()
    ranked = np.isin(ranking.doc_idx, pins)
    score_of = dict(zip(ranking.doc_idx[ranked].tolist(), ranking.scores[ranked].tolist()))
    pin_scores = np.array([score_of.get(int(p), np.nan) for p in pins], dtype=np.float64)
    docs = np.concatenate([pins, ranking.doc_idx[~ranked]])
    scores = np.concatenate([pin_scores, ranking.scores[~ranked].astype(np.float64)])
    return Ranking(docs, scores), tuple(pins.tolist())
