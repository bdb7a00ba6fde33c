"""Typo tolerance in the lexical leg: a query term the collection does not hold is matched to the terms it does hold
within a few edits, and BM25 scores each document by the best of those variants, down-weighted by distance.

Edits are those of the optimal string alignment distance: an insertion, a deletion, a substitution or a swap of two
adjacent characters is one edit each (Damerau's four; Lucene's FuzzyQuery with transpositions and Meilisearch count
alike), over the analysed terms (after lowercasing, folding and stemming), so "vitamn" finds the stem "vitamin".

The budget a request or a collection sets (`typo`):
  "auto"  1 edit for terms of 5 characters or more, 2 from 9 (Meilisearch's defaults): shorter terms have too many
          neighbours to guess from
  0       off
  1, 2    at most that many edits, for terms of 5 characters or more

Only terms the collection does not contain are expanded: a term it holds is taken as meant (the clean queries'
rankings do not move), and a misspelt one, which matches nothing, would otherwise lose its whole BM25 weight. A
variant counts `VARIANT_WEIGHTS[distance]` times its own BM25 score, and a document counts one variant per query
term (the best), so a typo never scores more than the word it stands for. At most MAX_VARIANTS variants a term, the
nearest and then the most frequent. CJK bigrams are never expanded (an edit of a two-character bigram is another word).

Matching: `Lexicon` holds the terms as code points end to end with, per term, its length and a 64-bit mask of the
characters it has. An edit changes the length by at most one and the mask by at most two bits, so only terms within
the budget on both are compared, by the distance itself, compiled (numba), with an early stop once a row exceeds the
budget: a vocabulary of 50,000 terms is searched in well under a millisecond.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from string import ascii_lowercase

import numba
import numpy as np

from hybrid_retrieval.common.errors import SpecError
from hybrid_retrieval.search.analyzer import Analyzer

TYPO_CHOICES: tuple[str | int, ...] = ("auto", 0, 1, 2)
DEFAULT_TYPO = "auto"
AUTO_LENGTHS = (5, 9)  # "auto": one edit from this many characters, two from that many
VARIANT_WEIGHTS = {1: 1.0, 2: 0.75}  # a variant's share of its BM25 score by its distance (fitted: docs/typos.md)
MAX_VARIANTS = 8


def variants(
    analyzer: Analyzer,
    query: str,
    typo: str | int,
    holds: Callable[[str], bool],
    near: Callable[[str, int], list[tuple[str, int]]],
    frequency: Callable[[str], int],
) -> dict[str, list[tuple[str, int]]]:
    """Each query term the collection does not hold (`holds`), whose word is long enough for `typo`: its variants
    (term, edits), the nearest first, then the most frequent, at most MAX_VARIANTS. Found two ways: the analysed term
    against the collection's terms (`near(term, edits)`), then, when that finds none a single edit away, the word's
    one-edit neighbours analysed (a swap in a suffix the stemmer strips leaves the term far from its stem: "dorsalyl"
    is one edit from "dorsally", stem "dorsal", but four from "dorsal")."""
    if typo == 0:
        return {}
    out: dict[str, list[tuple[str, int]]] = {}
    for term, start, end in analyzer.spans(query):
        word = query[start:end].lower()
        if term in out or holds(term) or not (budget := edit_budget(word, typo)):
            continue
        found = {variant: distance for variant, distance in near(term, budget) if holds(variant)}
        token = analyzer.token_of(word)
        if 1 not in found.values() and token is not None:  # the term may be a stem the edit moved (a swap in a suffix
            # the stemmer strips); a token's neighbours are tokens, normalised (the added letters are a-z)
            for variant in analyzer.stem_tokens(one_edit_away(token)):
                if variant is not None and variant != term and holds(variant):
                    found[variant] = 1
        out[term] = sorted(found.items(), key=lambda v: (v[1], -frequency(v[0]), v[0]))[:MAX_VARIANTS]
    return out


Variants = dict[str, list[tuple[str, int]]]  # by query term: (variant, edits), as `variants` returns them


@dataclass(frozen=True)
class TypoTerms:
    """What one part of a collection (a shard) holds of what typo tolerance may use for a query: the document
    frequency of each term named below, each long enough query term's near terms within its budget (term -> edits),
    and the terms its words' one-edit neighbours analyse to. Parts add up to what one index would see (`merged`)."""

    df: dict[str, int]
    near: dict[str, dict[str, int]]

    @classmethod
    def of(
        cls, analyzer: Analyzer, query: str, typo: str | int, df: Callable[[str], int], near: Callable[[str, int], list[tuple[str, int]]]
    ) -> TypoTerms:
        """`df(term)`: documents holding the term here (0: none); `near(term, edits)`: terms here within the edits."""
        frequencies: dict[str, int] = {}
        found: dict[str, dict[str, int]] = {}
        for term, start, end in analyzer.spans(query):
            frequencies[term] = df(term)
            word = query[start:end].lower()
            if not (budget := edit_budget(word, typo)):
                continue
            close = {variant: distance for variant, distance in near(term, budget) if df(variant) > 0}
            token = analyzer.token_of(word)
            neighbours = [v for v in analyzer.stem_tokens(one_edit_away(token)) if v is not None] if token is not None else []
            frequencies.update({variant: df(variant) for variant in [*close, *neighbours]})
            found[term] = close
        return cls({t: n for t, n in frequencies.items() if n > 0}, found)

    @staticmethod
    def merged(parts: Iterable[TypoTerms]) -> TypoTerms:
        df: Counter[str] = Counter()
        near: dict[str, dict[str, int]] = {}
        for part in parts:
            df.update(part.df)
            for term, close in part.near.items():
                near.setdefault(term, {}).update(close)
        return TypoTerms(dict(df), near)

    def variants(self, analyzer: Analyzer, query: str, typo: str | int) -> Variants:
        """The variants one index holding these terms would choose (`variants`)."""
        near = lambda term, edits: [(v, d) for v, d in self.near.get(term, {}).items() if d <= edits]
        return variants(analyzer, query, typo, lambda term: self.df.get(term, 0) > 0, near, lambda term: self.df.get(term, 0))


def one_edit_away(word: str) -> list[str]:
    """The distinct strings one edit from `word` (deletions, swaps of adjacent characters, substitutions and insertions
    of a-z and the word's own characters)."""
    alphabet = sorted(set(ascii_lowercase) | set(word))
    splits = [(word[:i], word[i:]) for i in range(len(word) + 1)]
    edits = {a + b[1:] for a, b in splits if b}
    edits |= {a + b[1] + b[0] + b[2:] for a, b in splits if len(b) > 1}
    edits |= {a + c + b[1:] for a, b in splits if b for c in alphabet}
    edits |= {a + c + b for a, b in splits for c in alphabet}
    edits.discard(word)
    return sorted(edits)


def check_typo(value: object) -> str | int:
    """A valid typo budget (SpecError naming `typo` otherwise)."""
    if isinstance(value, bool) or value not in TYPO_CHOICES:
        raise SpecError("typo", f"must be one of {', '.join(map(repr, TYPO_CHOICES))}, got {value!r}")
    return value


def edit_budget(term: str, typo: str | int) -> int:
    """How many edits a query term may be away from a variant under `typo` (0: it is matched exactly only)."""
    if typo == 0 or len(term) < AUTO_LENGTHS[0] or _is_cjk(term):
        return 0
    if typo == "auto":
        return 2 if len(term) >= AUTO_LENGTHS[1] else 1
    return int(typo)


def _is_cjk(term: str) -> bool:
    return any("\u3040" <= ch <= "\u30ff" or "\u3400" <= ch <= "\u9fff" or "\uac00" <= ch <= "\ud7af" for ch in term)


class Lexicon:
    """Terms searchable by edit distance, kept in order of length (`terms[i]` is what `near` returns position i for),
    so that only the terms of a near length are looked at."""

    def __init__(self, terms: Iterable[str]):
        self.terms = sorted(terms, key=len)
        self.lengths = np.fromiter((len(t) for t in self.terms), dtype=np.int64, count=len(self.terms))
        self.offsets = np.zeros(len(self.terms) + 1, dtype=np.int64)
        np.cumsum(self.lengths, out=self.offsets[1:])
        joined = "".join(self.terms)
        self.codes = np.frombuffer(joined.encode("utf-32-le"), dtype=np.uint32).astype(np.int64) if joined else np.zeros(0, np.int64)
        self.masks = np.fromiter((_mask(t) for t in self.terms), dtype=np.uint64, count=len(self.terms))
        self.counts = np.fromiter((_counts(t) for t in self.terms), dtype=np.uint64, count=len(self.terms))

    def near(self, term: str, edits: int) -> list[tuple[int, int]]:
        """(position, distance) of every term within `edits` of `term` (the term itself excluded: 0 edits)."""
        if edits <= 0 or not self.terms:
            return []
        low = int(np.searchsorted(self.lengths, len(term) - edits, side="left"))
        high = int(np.searchsorted(self.lengths, len(term) + edits, side="right"))
        query = np.array([ord(ch) for ch in term], dtype=np.int64)
        masks, counts = (self.masks, np.uint64(_mask(term))), (self.counts, np.uint64(_counts(term)))
        found, distances = _near(self.codes, self.offsets, masks, counts, low, high, query, edits)
        return list(zip(found.tolist(), distances.tolist()))


def warm() -> None:
    """Compile (or load from numba's cache) the distance kernel, so that no search waits for it."""
    Lexicon(["typo"]).near("tpyo", 1)


def _mask(term: str) -> int:
    mask = 0
    for ch in term:
        mask |= 1 << (ord(ch) % 64)
    return mask


def _counts(term: str) -> int:
    """How many of the term's characters fall in each of 16 classes (code point mod 16), 4 bits each, capped at 15."""
    counts = [0] * 16
    for ch in term:
        counts[ord(ch) % 16] += 1
    return sum(min(count, 15) << (4 * i) for i, count in enumerate(counts))


@numba.njit(cache=True, nogil=True)
def _near(codes, offsets, masks, counts, low, high, query, limit):
    """(positions, distances) of the terms low..high-1 within `limit` edits of `query` but not equal to it. Two cheap
    bounds first, as an edit changes at most two of either: the character masks (`masks`: the terms', the query's)
    differ in at most 2 * limit bits, counted for every term in a branch-free pass that vectorises; then the counts of
    16 character classes (`counts`) differ by at most 2 * limit in all; then the distance itself."""
    (term_masks, query_mask), (term_counts, query_counts) = masks, counts
    m1, m2, m4 = np.uint64(0x5555555555555555), np.uint64(0x3333333333333333), np.uint64(0x0F0F0F0F0F0F0F0F)
    bits = np.empty(high - low, dtype=np.uint64)
    for i in range(high - low):  # the population count of the masks' difference (SWAR)
        x = term_masks[low + i] ^ query_mask
        x = x - ((x >> np.uint64(1)) & m1)
        x = (x & m2) + ((x >> np.uint64(2)) & m2)
        bits[i] = (((x + (x >> np.uint64(4))) & m4) * np.uint64(0x0101010101010101)) >> np.uint64(56)
    candidates = low + np.flatnonzero(bits <= np.uint64(2 * limit))
    close = np.zeros(len(candidates), dtype=np.bool_)
    for k in range(len(candidates)):
        a, b, apart = term_counts[candidates[k]], query_counts, 0
        for _ in range(16):
            apart += abs(np.int64(a & np.uint64(15)) - np.int64(b & np.uint64(15)))
            a, b = a >> np.uint64(4), b >> np.uint64(4)
        close[k] = apart <= 2 * limit
    candidates = candidates[close]
    distances = _distances(codes, offsets, candidates, query, limit)
    within = (distances > 0) & (distances <= limit)
    return candidates[within], distances[within]


@numba.njit(cache=True, nogil=True)
def _distances(codes, offsets, candidates, query, limit):
    """The optimal string alignment distance of `query` to each candidate term, or limit + 1 when above `limit`."""
    n = len(query)
    out = np.full(len(candidates), limit + 1, dtype=np.int64)
    before, previous, current = np.empty(n + 1, np.int64), np.empty(n + 1, np.int64), np.empty(n + 1, np.int64)
    for k in range(len(candidates)):
        start, end = offsets[candidates[k]], offsets[candidates[k] + 1]
        for j in range(n + 1):
            previous[j] = j
        over = False
        for i in range(1, end - start + 1):
            a = codes[start + i - 1]
            current[0] = i
            lowest = i
            for j in range(1, n + 1):
                cost = 0 if a == query[j - 1] else 1
                best = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + cost)
                if i > 1 and j > 1 and a == query[j - 2] and codes[start + i - 2] == query[j - 1]:
                    best = min(best, before[j - 2] + 1)
                current[j] = best
                lowest = min(lowest, best)
            if lowest > limit:  # every later row is at least this far
                over = True
                break
            before, previous, current = previous, current, before
        if not over and previous[n] <= limit:
            out[k] = previous[n]
    return out
