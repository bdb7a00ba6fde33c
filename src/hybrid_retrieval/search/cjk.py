"""Chinese, Japanese and Korean text for BM25: runs of CJK characters, cut into overlapping character bigrams (as
Lucene's CJKAnalyzer does) or into words by a dictionary segmenter.

Written CJK has no spaces between words, so a word tokenizer sees a whole sentence as one token and a query term
never matches inside it. Bigrams need no dictionary and no language guess: `学生が試験` becomes 学生 生が が試 試験,
and a query analysed the same way matches the bigrams it shares. A segmenter (jieba for Chinese, SudachiPy for
Japanese, Kiwi for Korean, each an optional extra) cuts real words instead: fewer, more precise terms. Each
segmenter takes the runs of its own scripts; what is left of a run (Hangul in a Chinese collection, say) is bigrammed.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable
from functools import cache

from hybrid_retrieval.common.errors import ConfigError

# Han (with the ideographic marks 々〆〇), Hiragana, Katakana (with half-width forms) and Hangul: the scripts whose
# words are not separated by spaces. Punctuation (。、「」) and full-width Latin are not in it.
_HAN = "\u3005-\u3007\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002ebef\U00030000-\U0003134f"
_KANA = "\u3040-\u309f\u30a0-\u30ff\u31f0-\u31ff\uff66-\uff9f"
_HANGUL = "\u1100-\u11ff\u3130-\u318f\ua960-\ua97f\uac00-\ud7af\ud7b0-\ud7ff"
CJK_RUN = re.compile(f"[{_HAN}{_KANA}{_HANGUL}]+")
# what a segmenter reads at once: runs with the spaces between them (Korean separates words by spaces, and a
# segmenter needs the words around one to tag it)
CJK_PASSAGE = re.compile(f"[{_HAN}{_KANA}{_HANGUL}]+(?:\\s+[{_HAN}{_KANA}{_HANGUL}]+)*")

Token = tuple[str, int, int]  # term, start, end (code points into the text segmented)


def bigrams(run: str, offset: int = 0) -> list[Token]:
    """Overlapping character bigrams of a run; a run of one character is its own term (CJKBigramFilter)."""
    if len(run) == 1:
        return [(run, offset, offset + 1)]
    return [(run[i : i + 2], offset + i, offset + i + 2) for i in range(len(run) - 1)]


def _bigrammed(passage: str, start: int, end: int, offset: int) -> list[Token]:
    return [token for run in CJK_RUN.finditer(passage, start, end) for token in bigrams(run.group(), offset + run.start())]


class Segmenter:
    """A dictionary segmenter over the runs of `scripts`: `words(run)` gives its terms with offsets into the run."""

    name: str
    extra: str  # the package extra that installs it
    package: str  # its distribution, whose version the manifest records
    modules: tuple[str, ...]  # what must import (the library and its dictionary)
    scripts: str

    def __init__(self) -> None:
        self._pattern = re.compile(f"[{self.scripts}]+(?:\\s+[{self.scripts}]+)*")
        self._lock = threading.Lock()  # the tokenizers keep state between calls
        self._tokenizer: Callable[[str], list[Token]] | None = None

    def words(self, run: str) -> list[Token]:
        with self._lock:
            if self._tokenizer is None:
                self._tokenizer = self._load()
            return self._tokenizer(run)

    def tokens(self, passage: str, offset: int) -> list[Token]:
        """A passage's terms (CJK_PASSAGE): its parts in this segmenter's scripts segmented, the rest bigrammed."""
        found: list[Token] = []
        at = 0
        for part in self._pattern.finditer(passage):
            found += _bigrammed(passage, at, part.start(), offset)
            start = offset + part.start()
            found += [(word, start + s, start + e) for word, s, e in self.words(part.group())]
            at = part.end()
        return found + _bigrammed(passage, at, len(passage), offset)

    def _load(self) -> Callable[[str], list[Token]]:
        raise NotImplementedError


class Jieba(Segmenter):
    """Chinese words (jieba's precise mode, with its HMM for words outside the dictionary)."""

    name, extra, package, modules, scripts = "jieba", "zh", "jieba", ("jieba",), _HAN

    def _load(self) -> Callable[[str], list[Token]]:
        import jieba

        jieba.setLogLevel(logging.WARNING)
        tokenizer = jieba.Tokenizer()
        return lambda run: [(word, s, e) for word, s, e in tokenizer.tokenize(run) if word.strip()]


class Sudachi(Segmenter):
    """Japanese words (SudachiPy, core dictionary, its shortest units, normalised forms: 附属 and 付属 are one term);
    particles, auxiliary verbs and symbols are dropped, as Lucene's Kuromoji drops its stop tags."""

    name, extra, package, modules, scripts = "sudachi", "ja", "sudachipy", ("sudachipy", "sudachidict_core"), _HAN + _KANA
    _DROPPED = frozenset({"助詞", "助動詞", "補助記号", "記号", "空白"})

    def _load(self) -> Callable[[str], list[Token]]:
        from sudachipy import Dictionary, SplitMode

        tokenizer = Dictionary(dict="core").tokenizer(mode=SplitMode.A)
        dropped = self._DROPPED
        return lambda run: [
            (m.normalized_form(), m.begin(), m.end()) for m in tokenizer.tokenize(run) if m.part_of_speech()[0] not in dropped
        ]


class Kiwi(Segmenter):
    """Korean morphemes (kiwipiepy): nouns, verb and adjective stems, adverbs and roots; particles (J*), endings
    (E*), affixes, the copula and symbols are dropped, as Lucene's Nori drops its stop tags."""

    name, extra, package, modules, scripts = "kiwi", "ko", "kiwipiepy", ("kiwipiepy", "kiwipiepy_model"), _HANGUL + _HAN
    _DROPPED = ("J", "E", "XS", "XP", "VC", "SF", "SP", "SS", "SE", "SO", "SW", "W_")

    def _load(self) -> Callable[[str], list[Token]]:
        from kiwipiepy import Kiwi as KiwiTokenizer

        kiwi = KiwiTokenizer()
        dropped = self._DROPPED
        return lambda run: [(t.form, t.start, t.start + t.len) for t in kiwi.tokenize(run) if not t.tag.startswith(dropped)]


SEGMENTERS: dict[str, type[Segmenter]] = {kind.name: kind for kind in (Jieba, Sudachi, Kiwi)}
CJK_MODES = ("bigram", *SEGMENTERS, "none")  # none: a CJK run is one word, as before CJK analysis existed


@cache
def segmenter(name: str) -> Segmenter:
    """The process's one segmenter of each kind (dictionaries are large: every index shares it); ConfigError naming
    the extra to install when its library is missing."""
    kind = SEGMENTERS[name]
    for module in kind.modules:
        try:
            __import__(module)
        except ImportError:
            raise ConfigError(f"the {name} segmenter needs the {module} package: pip install 'hybrid-retrieval[{kind.extra}]'") from None
    return kind()
