"""Text analysis for BM25: Unicode normalisation, tokens, lower case, accent folding, stop words, stemming; CJK
runs as bigrams or dictionary words (search.cjk).

The analyzer's full specification (including its stopword list) is stored in the index manifest and rebuilt from
there for queries, so queries are always analysed exactly like the documents were. Its one changeable part is the
query-time synonym rules (search.synonyms), which need no rebuild.

Each step works on the text's stretches (a CJK run, or the text between runs) after they are normalised as a whole;
where normalising changes a stretch's length ('ﬁ' -> 'fi', 'İ' -> 'i̇'), it is normalised character by character so
that every term keeps exact offsets into the original text (`spans`, which highlights use).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from functools import cache, cached_property
from typing import Any

from hybrid_retrieval.common.errors import ConfigError
from hybrid_retrieval.search.cjk import CJK_MODES, CJK_PASSAGE, CJK_RUN, SEGMENTERS, Token, bigrams, segmenter
from hybrid_retrieval.search.synonyms import Synonyms

NORMALIZATIONS = ("none", "nfkc")
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


def _snowball_algorithms() -> tuple[str, ...]:
    import Stemmer

    return tuple(Stemmer.algorithms())


def _stopword_languages() -> tuple[str, ...]:
    import stop_words

    return tuple(stop_words.AVAILABLE_LANGUAGES)


STEMMERS = ("none", *_snowball_algorithms())
# en: the short English list above (Lucene's); a language: the `stop-words` package's list for it (mostly the
# Snowball project's lists); custom: the `stopword_list` given; none.
STOPWORD_LISTS = ("en", "none", "custom", *_stopword_languages())
# What `language` sets (Analyzer.for_language): its Snowball stemmer and stop words, and for Chinese, Japanese and
# Korean no stemmer, no stop list (bigrams are not words) and CJK bigrams.
CJK_LANGUAGES = ("chinese", "japanese", "korean")
LANGUAGES = tuple(sorted({*(a for a in STEMMERS if a not in ("none", "porter", "dutch_porter")), *CJK_LANGUAGES}))
_CODES = {
    "ar": "arabic", "hy": "armenian", "eu": "basque", "ca": "catalan", "cs": "czech", "da": "danish", "nl": "dutch",
    "en": "english", "eo": "esperanto", "et": "estonian", "fi": "finnish", "fr": "french", "de": "german",
    "el": "greek", "hi": "hindi", "hu": "hungarian", "id": "indonesian", "ga": "irish", "it": "italian",
    "lt": "lithuanian", "ne": "nepali", "no": "norwegian", "nb": "norwegian", "fa": "persian", "pl": "polish",
    "pt": "portuguese", "ro": "romanian", "ru": "russian", "sr": "serbian", "st": "sesotho", "es": "spanish",
    "sv": "swedish", "ta": "tamil", "tr": "turkish", "yi": "yiddish", "zh": "chinese", "ja": "japanese", "ko": "korean",
}  # fmt: skip


def language_name(language: str) -> str:
    """A language's name from its name or ISO 639-1 code; AnalyzerError listing the valid ones."""
    name = _CODES.get(language, language)
    if name not in LANGUAGES:
        raise AnalyzerError(f"unknown language {language!r}; valid: {', '.join(LANGUAGES)} (or their ISO 639-1 codes)")
    return name


def _fold(text: str) -> str:
    """Accents and other combining marks removed: 'é' -> 'e', 'ü' -> 'u' (letters such as 'ß' or 'ø' stay)."""
    decomposed = unicodedata.normalize("NFD", text)
    return unicodedata.normalize("NFC", "".join(c for c in decomposed if not unicodedata.combining(c)))


# token patterns whose tokens are the maximal runs of word characters ([A-Za-z0-9_] in ASCII), and the byte table
# that makes every other ASCII character a space
_WORD_RUNS = frozenset({r"(?u)\b\w+\b", r"\b\w+\b", r"(?u)\w+", r"\w+"})
_ASCII_WORD_BYTES = bytes(c if chr(c).isalnum() or chr(c) == "_" else ord(" ") for c in range(128)) + bytes(range(128, 256))

STEM_CACHE_WORDS = 200_000  # distinct words whose stems an analyzer remembers (tens of MB at most)


def _remembering(stem_words: Callable[[list[str]], list[str]]) -> Callable[[list[str]], list[str]]:
    """`stem_words` with the stems of the first STEM_CACHE_WORDS distinct words remembered: a corpus repeats its
    words, and a dictionary lookup costs a fraction of Snowball's stemming (which was half of analysing a document)."""
    known: dict[str, str] = {}

    def stem(words: list[str]) -> list[str]:
        try:
            return [known[word] for word in words]
        except KeyError:
            pass
        new = list(dict.fromkeys(word for word in words if word not in known))
        stems = dict(zip(new, stem_words(new), strict=True))
        if len(known) < STEM_CACHE_WORDS:
            known.update(stems)
        return [stems[word] if word in stems else known[word] for word in words]

    return stem


@dataclass(frozen=True)
class Analyzer:
    lowercase: bool = True
    stopwords: str = "en"
    # English: Porter's stemmer (Lucene's EnglishAnalyzer), and one-character terms kept (the 6 of "IL-6", the D of
    # "vitamin D"): both found more of the relevant documents (docs/experiments.md, "Winning without labels")
    stemmer: str = "porter"
    token_pattern: str = r"(?u)\b\w+\b"
    stopword_list: tuple[str, ...] = field(default=(), compare=True)
    normalization: str = "none"  # nfkc: compatibility forms folded (full-width 'Ａ' -> 'A', 'ﬁ' -> 'fi', '①' -> '1')
    fold_accents: bool = False
    cjk: str = "bigram"  # how runs of CJK characters become terms (search.cjk)

    def __post_init__(self) -> None:
        _choice("stopwords", self.stopwords, STOPWORD_LISTS)
        _choice("stemmer", self.stemmer, STEMMERS)
        _choice("normalization", self.normalization, NORMALIZATIONS)
        _choice("cjk", self.cjk, CJK_MODES)
        if self.stopwords == "custom" and not self.stopword_list:
            raise AnalyzerError("stopwords 'custom' needs a stopword_list")
        if not self.stopword_list:
            object.__setattr__(self, "stopword_list", _stopword_list(self.stopwords))
        elif self.stopwords == "none":
            raise AnalyzerError("stopwords 'none' takes no stopword_list (use 'custom')")
        try:
            re.compile(self.token_pattern)
        except re.error as exc:
            raise AnalyzerError(f"token_pattern is not a regular expression: {exc}") from None
        if self.cjk in SEGMENTERS:
            try:
                segmenter(self.cjk)
            except ConfigError as exc:  # its library is missing: the message names the extra to install
                raise AnalyzerError(str(exc)) from None

    @classmethod
    def for_language(cls, language: str, **overrides: Any) -> Analyzer:
        """The analyzer of a language (its name or ISO code): its stemmer and stop words, then `overrides`."""
        name = language_name(language)
        if name in CJK_LANGUAGES:
            base: dict[str, Any] = {"stemmer": "none", "stopwords": "none"}
        else:
            english = name == "english"
            base = {
                "stemmer": "porter" if english else name,
                "stopwords": "en" if english else (name if name in STOPWORD_LISTS else "none"),
            }
        return cls(**{**base, **overrides})

    @property
    def synonyms(self) -> Synonyms:
        return self.__dict__.get("_synonyms") or _NO_SYNONYMS

    def set_synonyms(self, rules: list[dict[str, Any]] | None, where: str = "synonyms") -> None:
        """Replace the query-time synonym rules (SpecError naming the rule at fault; nothing changes then). The one
        changeable part of an analyzer: swapped whole, so a search sees the old rules or the new ones."""
        self.__dict__["_synonyms"] = Synonyms(rules, self.analyze, where)

    @cached_property
    def _pattern(self) -> re.Pattern[str]:
        return re.compile(self.token_pattern)

    @cached_property
    def _stopset(self) -> frozenset[str]:
        return frozenset(self._transform(word, cjk=False) for word in self.stopword_list)

    @cached_property
    def _stem(self) -> Callable[[list[str]], list[str]] | None:
        if self.stemmer == "none":
            return None
        import Stemmer

        return _remembering(Stemmer.Stemmer(self.stemmer).stemWords)

    def analyze(self, text: str) -> list[str]:
        """The terms BM25 indexes for a text (a document's, or a query's before synonyms)."""
        return self._terms(self.tokens(text))

    def tokens(self, text: str) -> list[str]:
        """A text's normalised tokens, stop words included: analyze's first step (stem_tokens makes them terms)."""
        tokens: list[str] = []
        for _, stretch, is_cjk in self._stretches(text):
            normalized, _ = self._normalized(stretch, is_cjk)
            if is_cjk:
                tokens += [term for term, _, _ in self._cjk_tokens(normalized)]
            else:
                tokens += self._words(normalized)
        return tokens

    def _words(self, text: str) -> list[str]:
        """The tokens of a stretch that is not CJK. Runs of word characters are cut at the ASCII characters that are not
        by a byte table and str.split (3-4x the regex's speed); only pieces with other characters need the regex."""
        if self.token_pattern not in _WORD_RUNS:
            return self._pattern.findall(text)
        if text.isascii():
            return text.encode("ascii").translate(_ASCII_WORD_BYTES).decode("ascii").split()
        words: list[str] = []
        for piece in text.encode().translate(_ASCII_WORD_BYTES).decode().split():  # UTF-8 keeps ASCII bytes for ASCII only
            if piece.isascii():
                words.append(piece)
            else:
                words += self._pattern.findall(piece)
        return words

    def token_of(self, word: str) -> str | None:
        """`word` normalised, if it is one token (None otherwise)."""
        normalized = self._transform(word, False)
        return normalized if self._pattern.fullmatch(normalized) else None

    def stem_tokens(self, tokens: list[str]) -> list[str | None]:
        """The term of each normalised token (None: a stopword), stemmed without remembering the tokens (made-up words,
        such as a typo's neighbours, would fill the memory kept for a corpus's)."""
        terms = [t if t not in self._stopset else None for t in tokens]
        if self._raw_stem is None:
            return terms
        stems = iter(self._raw_stem.stemWords([t for t in terms if t is not None]))
        return [next(stems) or None if t is not None else None for t in terms]

    @cached_property
    def _raw_stem(self) -> Any:  # a Stemmer.Stemmer (untyped), or None
        if self.stemmer == "none":
            return None
        import Stemmer

        return Stemmer.Stemmer(self.stemmer, 0)  # no cache: made-up words only churn it (3 times slower with it)

    def query_terms(self, query: str) -> list[str]:
        """A query's terms with what the synonym rules add."""
        return self.synonyms.expand(self.analyze(query))

    def spans(self, text: str) -> list[Token]:
        """Each term `analyze(text)` yields, in order, as (term, start, end): code-point offsets into `text`."""
        found: list[Token] = []
        for offset, stretch, is_cjk in self._stretches(text):
            normalized, origin = self._normalized(stretch, is_cjk)
            pieces = self._cjk_tokens(normalized) if is_cjk else [(m.group(), *m.span()) for m in self._pattern.finditer(normalized)]
            for token, start, end in pieces:
                if origin is not None:
                    start, end = origin[start], origin[end - 1] + 1
                found.append((token, offset + start, offset + end))
        kept = [token for token in found if token[0] not in self._stopset]
        words = [token for token, _, _ in kept]
        terms = self._stem(words) if self._stem is not None else words
        return [(term, start, end) for term, (_, start, end) in zip(terms, kept, strict=True) if term]

    def _terms(self, tokens: list[str]) -> list[str]:
        tokens = [t for t in tokens if t not in self._stopset]
        if self._stem is None:
            return tokens
        return [term for term in self._stem(tokens) if term]  # Porter stems "s" to "": no term, nothing can match it

    def _stretches(self, text: str) -> Iterator[tuple[int, str, bool]]:
        """(offset, stretch, is a CJK run) covering the text in order."""
        if self.cjk == "none" or text.isascii():  # isascii: a fast C scan, where most texts need no regex search
            yield 0, text, False
            return
        at = 0
        runs = CJK_RUN if self.cjk == "bigram" else CJK_PASSAGE
        for run in runs.finditer(text):
            if run.start() > at:
                yield at, text[at : run.start()], False
            yield run.start(), run.group(), True
            at = run.end()
        if at < len(text) or at == 0:
            yield at, text[at:], False

    def _transform(self, text: str, cjk: bool) -> str:
        if self.normalization == "nfkc":
            text = unicodedata.normalize("NFKC", text)
        if self.lowercase:
            text = text.lower()
        if self.fold_accents and not cjk:  # folding kana would drop their voicing marks (が -> か)
            text = _fold(text)
        return text

    def _normalized(self, stretch: str, cjk: bool) -> tuple[str, list[int] | None]:
        """The stretch normalised, and None when offsets map 1:1, else each normalised character's original offset."""
        normalized = self._transform(stretch, cjk)
        if len(normalized) == len(stretch):
            return normalized, None
        pieces = [self._transform(c, cjk) for c in stretch]
        return "".join(pieces), [i for i, piece in enumerate(pieces) for _ in piece]

    def _cjk_tokens(self, run: str) -> list[Token]:
        return bigrams(run) if self.cjk == "bigram" else segmenter(self.cjk).tokens(run, 0)

    def libraries(self) -> tuple[str, ...]:
        """The distributions whose versions decide this analyzer's terms (recorded in the manifest at build)."""
        return (("PyStemmer",) if self.stemmer != "none" else ()) + ((SEGMENTERS[self.cjk].package,) if self.cjk in SEGMENTERS else ())

    def __reduce__(self) -> tuple[Callable[[dict[str, Any]], Analyzer], tuple[dict[str, Any]]]:
        """Pickled as its fields (a build in another process analyses alike): its caches are made again there, and
        its query-time synonyms stay behind."""
        return Analyzer.from_dict, (self.to_dict(),)

    def to_dict(self) -> dict[str, Any]:
        spec = asdict(self)
        spec["stopword_list"] = list(self.stopword_list)
        return spec

    @classmethod
    def from_dict(cls, spec: dict[str, Any]) -> Analyzer:
        known = {f for f in cls.__dataclass_fields__}
        unknown = set(spec) - known
        if unknown:
            raise AnalyzerError(f"unknown analyzer fields {sorted(unknown)}; valid: {sorted(known)}")
        # a manifest written before CJK analysis: CJK runs stayed whole words, and must stay so for its queries
        legacy = {"cjk": "none"}
        return cls(**{**legacy, **spec, "stopword_list": tuple(spec.get("stopword_list", ()))})


_NO_SYNONYMS = Synonyms()


def _choice(name: str, value: object, valid: tuple[str, ...]) -> None:
    if value not in valid:
        raise AnalyzerError(f"unknown {name} {value!r}; valid: {', '.join(valid)}")


@cache
def _stopword_list(stopwords: str) -> tuple[str, ...]:
    if stopwords == "en":
        return _STOPWORDS_EN
    if stopwords in ("none", "custom"):
        return ()
    import stop_words

    return tuple(stop_words.get_stop_words(stopwords))
