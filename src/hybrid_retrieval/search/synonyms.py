"""Query-time synonyms for the lexical leg.

Rules, as a collection's `synonyms` setting takes them (editable without a rebuild: documents are indexed as they
are, only queries change):

    [{"equivalent": ["car", "automobile", "auto"]},                  # any of them brings the others
     {"from": "heart attack", "to": ["myocardial infarction"]}]      # one way: "myocardial infarction" stays as is

Each phrase is analysed by the collection's analyzer, so a rule written with inflected or upper-case words matches
what the analyzer makes of a query. When a rule's phrase occurs in a query's terms (in order, next to each other),
the terms of its other phrases are added to the query once each; BM25 then scores them like the query's own terms.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hybrid_retrieval.common.errors import SpecError

MAX_RULES = 10_000
Phrase = tuple[str, ...]


class Synonyms:
    """Rules analysed once; `expand(terms)` adds what they bring. Immutable: a change builds a new one."""

    def __init__(self, rules: list[dict] | None = None, analyze: Callable[[str], list[str]] | None = None, where: str = "synonyms"):
        self.rules = parse_rules(rules or [], where)
        self._targets: dict[str, list[tuple[Phrase, list[Phrase]]]] = {}  # first term -> (phrase, what it brings)
        for i, rule in enumerate(self.rules):
            sources, targets = _sides(rule)
            analysed = {phrase: _analysed(analyze, phrase, f"{where}[{i}]") for phrase in {*sources, *targets}}
            for source in sources:
                brings = [analysed[t] for t in targets if analysed[t] != analysed[source]]
                if brings:
                    self._targets.setdefault(analysed[source][0], []).append((analysed[source], brings))

    def __bool__(self) -> bool:
        return bool(self._targets)

    def expand(self, terms: list[str]) -> list[str]:
        if not self._targets:
            return terms
        added: list[Phrase] = []
        for i, term in enumerate(terms):
            for phrase, brings in self._targets.get(term, ()):
                if tuple(terms[i : i + len(phrase)]) == phrase:
                    added += [target for target in brings if target not in added]
        return terms + [term for phrase in added for term in phrase]


def parse_rules(rules: Any, where: str) -> list[dict]:
    """The rules in their canonical form (`equivalent` lists, or `from`/`to` lists); SpecError naming the field."""
    if not isinstance(rules, list):
        raise SpecError(where, 'must be a list of rules: {"equivalent": [...]} or {"from": ..., "to": [...]}')
    if len(rules) > MAX_RULES:
        raise SpecError(where, f"at most {MAX_RULES} rules")
    parsed = []
    for i, rule in enumerate(rules):
        at = f"{where}[{i}]"
        if not isinstance(rule, dict) or not rule or set(rule) - {"equivalent", "from", "to"}:
            raise SpecError(at, 'a rule is {"equivalent": [phrases]} or {"from": phrase(s), "to": [phrases]}')
        if "equivalent" in rule:
            if set(rule) != {"equivalent"}:
                raise SpecError(at, "an equivalent rule takes no from/to")
            phrases = _phrases(rule["equivalent"], f"{at}.equivalent")
            if len(phrases) < 2:
                raise SpecError(f"{at}.equivalent", "needs at least two phrases")
            parsed.append({"equivalent": phrases})
        else:
            if set(rule) != {"from", "to"}:
                raise SpecError(at, "a one-way rule needs both from and to")
            parsed.append({"from": _phrases(rule["from"], f"{at}.from"), "to": _phrases(rule["to"], f"{at}.to")})
    return parsed


def _phrases(value: Any, where: str) -> list[str]:
    phrases = [value] if isinstance(value, str) else value
    if not isinstance(phrases, list) or not phrases or not all(isinstance(p, str) and p.strip() for p in phrases):
        raise SpecError(where, "must be a phrase or a list of non-empty phrases")
    return list(phrases)


def _sides(rule: dict) -> tuple[list[str], list[str]]:
    if "equivalent" in rule:
        return rule["equivalent"], rule["equivalent"]
    return rule["from"], rule["to"]


def _analysed(analyze: Callable[[str], list[str]] | None, phrase: str, where: str) -> Phrase:
    terms = tuple(analyze(phrase) if analyze is not None else phrase.lower().split())
    if not terms:
        raise SpecError(where, f"{phrase!r} analyses to no terms (only stop words or too-short words)")
    return terms
