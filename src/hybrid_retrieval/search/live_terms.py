"""Written documents' terms, as ids of a collection's live vocabulary (term -> id, append-only), a write batch at a
time.

Analysed one document at a time (stop words, the stemmer, a Counter of its terms), a written document cost about
150 µs, most of an API write and all of it holding the interpreter lock, so searches queued behind bulk loads. Here
each text is only tokenised; each distinct token is stopped and stemmed once, then remembered as its term's id, and
a batch's terms are counted by NumPy at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain, pairwise

import numpy as np

from hybrid_retrieval.search.analyzer import Analyzer
from hybrid_retrieval.search.postings import narrowest

NO_TERM = -1  # a token that makes no term: a stop word, or one its stemmer leaves empty
WORDS_REMEMBERED = 200_000  # distinct tokens a coder remembers (a few tens of MB); later ones are stemmed each time


@dataclass(frozen=True)
class TermCounts:
    """A text's distinct terms (ascending ids) and their frequencies, in the text and in its title."""

    term_ids: np.ndarray  # int32
    tfs: np.ndarray  # narrowest unsigned type (search.postings.narrowest)
    title_tfs: np.ndarray  # likewise: how many of each term's occurrences are the title's
    length: int  # terms in the text
    title_length: int  # terms in the title


def term_counts(ids: np.ndarray, lengths: np.ndarray, title_ids: np.ndarray, title_lengths: np.ndarray) -> list[TermCounts]:
    """Each text's TermCounts from its term ids: the texts' `ids` concatenated, `lengths` of them each, and their
    titles' likewise (a title's terms are among its text's). The arrays of a batch are shared (views)."""
    texts = len(lengths)
    width = int(max(ids.max(initial=-1), title_ids.max(initial=-1))) + 1
    keys = np.repeat(np.arange(texts, dtype=np.int64), lengths) * width + ids
    distinct, tfs = np.unique(keys, return_counts=True)  # by text, then term
    title_keys, in_titles = np.unique(np.repeat(np.arange(texts, dtype=np.int64), title_lengths) * width + title_ids, return_counts=True)
    at = np.searchsorted(distinct, title_keys)
    found = at < len(distinct)
    found[found] = distinct[at[found]] == title_keys[found]
    title_tfs = np.zeros(len(distinct), dtype=np.int64)
    title_tfs[at[found]] = in_titles[found]
    bounds = np.searchsorted(distinct, np.arange(texts + 1, dtype=np.int64) * width).tolist()
    terms, tfs, title_tfs = (distinct % width).astype(np.int32), narrowest(tfs), narrowest(title_tfs)
    sizes, title_sizes = lengths.tolist(), title_lengths.tolist()
    return [
        TermCounts(terms[start:end], tfs[start:end], title_tfs[start:end], sizes[i], title_sizes[i])
        for i, (start, end) in enumerate(pairwise(bounds))
    ]


def coded(terms: list[str], vocabulary: dict[str, int]) -> np.ndarray:
    """Analysed terms as ids of `vocabulary`, which gains the new ones."""
    return np.fromiter((vocabulary.setdefault(t, len(vocabulary)) for t in terms), dtype=np.int64, count=len(terms))


class TermCoder:
    """Texts analysed into ids of `vocabulary`, which gains the new terms."""

    def __init__(self, vocabulary: dict[str, int]):
        self.vocabulary = vocabulary
        self.analyzer: Analyzer | None = None
        self.known: dict[str, int] = {}  # token -> its term's id (or NO_TERM) by `analyzer`

    def counts(self, analyzer: Analyzer, texts: list[str], titles: list[str] | None = None) -> list[TermCounts]:
        """Each text's TermCounts by `analyzer`; `titles`: each text's title, which the text contains (None: no
        title terms)."""
        if analyzer != self.analyzer:  # the tokens remembered are one analyzer's
            self.analyzer, self.known = analyzer, {}
        ids, lengths = self._code(analyzer, texts)
        title_ids, title_lengths = self._code(analyzer, titles) if titles is not None else (ids[:0], np.zeros(len(texts), dtype=np.int64))
        return term_counts(ids, lengths, title_ids, title_lengths)

    def _code(self, analyzer: Analyzer, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """The texts' term ids, concatenated, and how many each text has."""
        tokens = [analyzer.tokens(text) for text in texts]
        flat = list(chain.from_iterable(tokens))
        found = np.array(list(map(self.known.get, flat)), dtype=np.float64)  # a token not remembered: None -> NaN
        unknown = np.flatnonzero(np.isnan(found))
        if len(unknown):
            found[unknown] = self._learn(analyzer, [flat[i] for i in unknown.tolist()])
        ids = found.astype(np.int64)
        kept = ids != NO_TERM
        text_of = np.repeat(np.arange(len(texts)), [len(t) for t in tokens])
        return ids[kept], np.bincount(text_of[kept], minlength=len(texts))

    def _learn(self, analyzer: Analyzer, tokens: list[str]) -> list[int]:
        """The ids of tokens not remembered, remembered while there is room."""
        new = list(dict.fromkeys(tokens))
        vocabulary = self.vocabulary
        ids = {
            token: NO_TERM if term is None else vocabulary.setdefault(term, len(vocabulary))
            for token, term in zip(new, analyzer.stem_tokens(new), strict=True)
        }
        if len(self.known) < WORDS_REMEMBERED:
            self.known.update(ids)
        return [ids[token] for token in tokens]
