"""Text analysis for BM25: tokenise, lowercase, drop stopwords, stem.

The analyzer's full specification (including its stopword list) is stored in the index
manifest and rebuilt from there for queries, so queries are always analysed exactly like
the documents were.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import cached_property
from typing import Any

from hybrid_retrieval.search.errors import ConfigError

STOPWORD_LISTS = ("en", "none")
STEMMERS = ("english", "none")
# The English stopword list used by Lucene and bm25s (the published scifact baselines).
_STOPWORDS_EN = (
    "a",
    "an",
    "and",
    "are",
    "as",
    "at",
    "be",
    "but",
    "by",
    "for",
    "if",
    "in",
    "into",
    "is",
    "it",
    "no",
    "not",
    "of",
    "on",
    "or",
    "such",
    "that",
    "the",
    "their",
    "then",
    "there",
    "these",
    "they",
    "this",
    "to",
    "was",
    "will",
    "with",
)


class AnalyzerError(ConfigError):
    """Invalid analyzer specification."""


@dataclass(frozen=True)
class Analyzer:
    lowercase: bool = True
    stopwords: str = "en"
    stemmer: str = "english"
    token_pattern: str = r"(?u)\b\w\w+\b"
    stopword_list: tuple[str, ...] = field(default=(), compare=True)

    def __post_init__(self) -> None:
        if self.stopwords not in STOPWORD_LISTS:
            raise AnalyzerError(f"unknown stopwords {self.stopwords!r}; valid: {', '.join(STOPWORD_LISTS)}")
        if self.stemmer not in STEMMERS:
            raise AnalyzerError(f"unknown stemmer {self.stemmer!r}; valid: {', '.join(STEMMERS)}")
        if not self.stopword_list and self.stopwords == "en":
            object.__setattr__(self, "stopword_list", _STOPWORDS_EN)

    @cached_property
    def _pattern(self) -> re.Pattern[str]:
        return re.compile(self.token_pattern)

    @cached_property
    def _stopset(self) -> frozenset[str]:
        return frozenset(self.stopword_list)

    @cached_property
    def _stem(self) -> Callable[[list[str]], list[str]] | None:
        if self.stemmer == "none":
            return None
        import Stemmer

        stem: Callable[[list[str]], list[str]] = Stemmer.Stemmer(self.stemmer).stemWords
        return stem

    def analyze(self, text: str) -> list[str]:
        if self.lowercase:
            text = text.lower()
        tokens = [t for t in self._pattern.findall(text) if t not in self._stopset]
        return self._stem(tokens) if self._stem is not None else tokens

    def to_dict(self) -> dict[str, Any]:
        spec = asdict(self)
        spec["stopword_list"] = list(self.stopword_list)
        return spec

    @classmethod
    def from_dict(cls, spec: dict[str, Any]) -> Analyzer:
        known = {"lowercase", "stopwords", "stemmer", "token_pattern", "stopword_list"}
        unknown = set(spec) - known
        if unknown:
            raise AnalyzerError(f"unknown analyzer fields {sorted(unknown)}; valid: {sorted(known)}")
        return cls(**{**spec, "stopword_list": tuple(spec.get("stopword_list", ()))})
