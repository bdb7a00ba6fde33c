"""Query-term highlighting of search hits, matched through the index's analyzer.

A field is tokenised exactly like BM25 indexed it (`Analyzer.spans`: the analyzer's terms with their
character offsets in the original text), so the query `bleeding` marks `bleed` and `Bleeds` (all stem to
`bleed`). `Highlighter.highlight` picks the best windows of about `snippet_chars` characters (most distinct
query terms, then most matched tokens, then earliest), snapped to word and sentence boundaries, and renders
them HTML-safe: the field's text escaped, matched tokens in `<mark>`, "…" where the field goes on.

`split_sentences` / `best_sentence` pick the sentence closest to the query by embedding (the caller embeds;
no model here).
"""

from __future__ import annotations

import html
import re
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hybrid_retrieval.common.errors import SpecError
from hybrid_retrieval.search.analyzer import Analyzer
from hybrid_retrieval.search.checks import number

DEFAULT_SNIPPET_CHARS = 160
DEFAULT_SNIPPETS = 1
SNIPPET_CHARS_RANGE = (20, 2000)
SNIPPETS_RANGE = (1, 10)
MAX_SEMANTIC_HITS = 100
ELLIPSIS = "\u2026"

# A window edge inside a whitespace-free run that reaches a match moves out to the run's edge only when
# that is at most this many characters away (else it just avoids cutting inside a token).
_MAX_WORD_EXTENSION = 30
_WORD = re.compile(r"\S+")
# end() is where the next sentence starts: after . ! ? and whitespace, or after a newline.
_SENTENCE_START = re.compile(r"(?:[.!?]\s+|\n\s*)(?=\S)")
_SENTENCE_BREAK = re.compile(r"(?<=[.!?])\s+|\n")


def check_snippet_options(snippet_chars: object, max_snippets: object) -> tuple[int, int]:
    """(snippet_chars, max_snippets) as ints within their ranges, else SpecError naming `snippet_chars` / `snippets`."""
    chars = number("snippet_chars", snippet_chars, *SNIPPET_CHARS_RANGE, integer=True)
    count = number("snippets", max_snippets, *SNIPPETS_RANGE, integer=True)
    return chars, count


def check_semantic_hits(semantic: bool, k: int) -> None:
    """Semantic highlights embed every sentence of the page's hits: at most MAX_SEMANTIC_HITS hits a page."""
    if semantic and k > MAX_SEMANTIC_HITS:
        raise SpecError(
            "highlight.semantic",
            f"at most {MAX_SEMANTIC_HITS} hits a page with semantic highlights "
            f"(each embeds every sentence of its hits), got k = {k}; page through more with offset",
        )


@dataclass(frozen=True)
class Snippet:
    """A highlighted passage of a field.

    `text` is HTML-safe (the field's text escaped, matched tokens in `<mark>`…`</mark>`, "…" before/after when the
    field goes on); `start`/`end` its span in the original field; `matches` the (start, end) of each marked token in
    the original field; `terms` the distinct analysed query terms it matches, sorted.
    """

    text: str
    start: int
    end: int
    matches: list[tuple[int, int]]
    terms: list[str]

    def to_dict(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "start": self.start,
            "end": self.end,
            "matches": [[s, e] for s, e in self.matches],
            "terms": list(self.terms),
        }


def _is_word_char(char: str) -> bool:
    return char.isalnum() or char == "_"


class _Field:
    """One field's text and its query-term matches, with the word layout for snapping window edges."""

    def __init__(self, text: str, hits: list[tuple[str, int, int]]):
        self.text = text
        self.terms = [term for term, _, _ in hits]
        self.hit_starts = [start for _, start, _ in hits]
        self.hit_ends = [end for _, _, end in hits]  # ascending with the starts (CJK bigrams overlap, in order)
        words = [m.span() for m in _WORD.finditer(text)]
        self.word_starts = [start for start, _ in words]
        self.word_ends = [end for _, end in words]
        self._sentences: list[int] | None = None

    # -- window edges --

    def _sentence_starts(self) -> list[int]:
        if self._sentences is None:
            self._sentences = [0] + [m.end() for m in _SENTENCE_START.finditer(self.text)]
        return self._sentences

    def _sentence_start(self, pos: int, low: int, high: int) -> int | None:
        """The sentence start in [low, high] nearest to `pos` (the earlier on a tie), if any."""
        starts = self._sentence_starts()
        i = bisect_left(starts, pos)
        near = [start for start in starts[max(0, i - 1) : i + 1] if low <= start <= high]
        return min(near, key=lambda start: (abs(start - pos), start)) if near else None

    def _snap_start(self, pos: int, limit: int) -> int:
        """`pos` moved off the inside of a word; never past `limit` (the first match's start)."""
        ws, we = self.word_starts, self.word_ends
        i = bisect_right(ws, pos) - 1
        if i < 0 or pos == ws[i] or pos >= we[i]:
            return pos
        if we[i] <= limit:  # the cut word ends before the first match: start at the next word
            return ws[i + 1]
        if pos - ws[i] <= _MAX_WORD_EXTENSION:
            return ws[i]
        text = self.text
        while pos < limit and _is_word_char(text[pos - 1]) and _is_word_char(text[pos]):
            pos += 1
        return pos

    def _snap_end(self, pos: int, limit: int) -> int:
        """`pos` moved off the inside of a word; never before `limit` (the last match's end)."""
        text = self.text
        if pos >= len(text):
            return len(text)
        ws, we = self.word_starts, self.word_ends
        i = bisect_right(ws, pos) - 1
        if i < 0 or pos == ws[i] or pos >= we[i]:
            return pos
        if ws[i] >= limit:  # the cut word starts after the last match: end before it
            return ws[i]
        if we[i] - pos <= _MAX_WORD_EXTENSION:
            return we[i]
        while pos > limit and _is_word_char(text[pos - 1]) and _is_word_char(text[pos]):
            pos -= 1
        return pos

    def _strip(self, start: int, end: int) -> tuple[int, int]:
        """[start, end) without leading/trailing whitespace (it holds at least one match, so is never blank)."""
        ws, we = self.word_starts, self.word_ends
        i = bisect_right(ws, start) - 1
        if i < 0 or start >= we[i]:
            start = ws[i + 1]
        j = bisect_right(ws, end - 1) - 1
        if end - 1 >= we[j]:
            end = we[j]
        return start, end

    def whole(self) -> tuple[int, int]:
        return self.word_starts[0], self.word_ends[-1]

    def window(self, anchor: int, size: int) -> tuple[int, int]:
        """A window of about `size` characters holding match `anchor` about a quarter in, edges on word boundaries;
        it starts at the sentence start nearest that position when one lies between a quarter-window before it and
        the window's first match."""
        n = len(self.text)
        starts, ends = self.hit_starts, self.hit_ends
        quarter = size // 4
        pos = min(max(0, starts[anchor] - quarter), max(0, n - size))
        first = starts[bisect_left(starts, pos)]
        start = self._sentence_start(pos, max(pos - quarter, ends[anchor] - size), first)  # keeping the anchor inside
        if start is None:
            start = self._snap_start(pos, first)
        end_pos = max(min(n, start + size), ends[anchor])
        last = ends[bisect_right(ends, end_pos) - 1]
        return self._strip(start, self._snap_end(end_pos, last))

    # -- scoring and rendering --

    def _hits_in(self, start: int, end: int) -> range:
        return range(bisect_left(self.hit_starts, start), bisect_right(self.hit_ends, end))

    def score(self, window: tuple[int, int]) -> tuple[int, int, int, int]:
        """Sort key, best first: most distinct terms, most matched tokens, earliest."""
        inside = self._hits_in(*window)
        return -len({self.terms[k] for k in inside}), -len(inside), window[0], window[1]

    def snippet(self, start: int, end: int) -> Snippet:
        text = self.text
        inside = self._hits_in(start, end)
        matches: list[tuple[int, int]] = []
        for k in inside:  # overlapping tokens (CJK bigrams: 计算 and 算机) are marked as one stretch (计算机)
            if matches and self.hit_starts[k] < matches[-1][1]:
                matches[-1] = (matches[-1][0], self.hit_ends[k])
            else:
                matches.append((self.hit_starts[k], self.hit_ends[k]))
        parts = [ELLIPSIS] if start > self.word_starts[0] else []
        pos = start
        for s, e in matches:
            parts += [html.escape(text[pos:s]), "<mark>", html.escape(text[s:e]), "</mark>"]
            pos = e
        parts.append(html.escape(text[pos:end]))
        if end < self.word_ends[-1]:
            parts.append(ELLIPSIS)
        return Snippet("".join(parts), start, end, matches, sorted({self.terms[k] for k in inside}))


class Highlighter:
    """Highlights query terms in fields analysed like the index's documents (pass the index's analyzer)."""

    def __init__(self, analyzer: Analyzer):
        self.analyzer = analyzer

    def query_terms(self, query: str) -> frozenset[str]:
        """The analysed query terms (with what synonyms add); pass them as `terms=` to highlight many hits without
        re-analysing the query."""
        return frozenset(self.analyzer.query_terms(query))

    def _field(self, query: str, field_text: str, terms: Iterable[str] | None) -> _Field | None:
        wanted = self.query_terms(query) if terms is None else frozenset(terms)
        if not wanted or not field_text:
            return None
        hits = [hit for hit in self.analyzer.spans(field_text) if hit[0] in wanted]
        return _Field(field_text, hits) if hits else None

    def highlight(
        self,
        query: str,
        field_text: str,
        snippet_chars: int = DEFAULT_SNIPPET_CHARS,
        max_snippets: int = DEFAULT_SNIPPETS,
        *,
        terms: Iterable[str] | None = None,
    ) -> list[Snippet]:
        """Up to `max_snippets` non-overlapping snippets of `field_text`, best first; [] when no query term matches.

        A field of at most `snippet_chars` characters is one snippet, the whole field. `terms` (from `query_terms`)
        replaces analysing `query`.
        """
        snippet_chars, max_snippets = check_snippet_options(snippet_chars, max_snippets)
        field = self._field(query, field_text, terms)
        if field is None:
            return []
        if len(field_text) <= snippet_chars:
            return [field.snippet(*field.whole())]
        windows = sorted({field.window(k, snippet_chars) for k in range(len(field.hit_starts))}, key=field.score)
        chosen: list[tuple[int, int]] = []
        for start, end in windows:
            if all(end <= s or start >= e for s, e in chosen):
                chosen.append((start, end))
                if len(chosen) == max_snippets:
                    break
        return [field.snippet(start, end) for start, end in chosen]


def split_sentences(text: str) -> list[tuple[int, int]]:
    """Sentence spans of `text`: split after . ! ? followed by whitespace and at newlines, edges stripped of
    whitespace, blank spans dropped; a text without a boundary is one sentence."""
    spans = []
    pos = 0
    for m in [*_SENTENCE_BREAK.finditer(text), None]:
        start, end = pos, (len(text) if m is None else m.start())
        while start < end and text[start].isspace():
            start += 1
        while end > start and text[end - 1].isspace():
            end -= 1
        if start < end:
            spans.append((start, end))
        if m is not None:
            pos = m.end()
    return spans


def best_sentence(
    text: str, spans: Sequence[tuple[int, int]], sentence_vectors: np.ndarray, query_vector: np.ndarray
) -> dict[str, Any] | None:
    """The sentence whose vector is closest to the query's: {"text" (HTML-escaped), "start", "end", "score"}.

    Vectors are unit-normalised, so the score is the cosine (the dot product); ties go to the earlier sentence.
    None when there are no sentences (a blank text).
    """
    if not spans:
        return None
    vectors = np.asarray(sentence_vectors)
    if vectors.ndim != 2 or len(vectors) != len(spans):
        raise ValueError(f"need one vector per sentence: {len(spans)} spans, vectors of shape {vectors.shape}")
    scores = vectors @ np.asarray(query_vector).ravel()
    best = int(np.argmax(scores))
    start, end = spans[best]
    return {"text": html.escape(text[start:end]), "start": int(start), "end": int(end), "score": float(scores[best])}
