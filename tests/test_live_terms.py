"""Written documents' terms a batch at a time (search.live_terms) against analysing them one by one, and the
analyzer's fast tokenisation against its regular expression."""

import re
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hybrid_retrieval.search import live_terms
from hybrid_retrieval.search.analyzer import Analyzer
from hybrid_retrieval.search.live_terms import TermCoder

TITLES = ["The IL-6 response", "", "Vitamin D and bones", "Über Straße", "是一个 test", "s s s", "A_b c9 d–e"]
TEXTS = [
    "Cells respond to IL-6; the cells' responses vary (n=12).",
    "it is what it is",
    "Vitamin D deficiency: 25(OH)D levels < 20 ng/mL in 40% of adults.",
    "Die Straße ist lang, und die Häuser sind alt — café naïve résumé.",
    "这是一个测试 mixed with English words and 日本語のテキスト",
    "s s s s",
    "snake_case and x–y and α-synuclein µg ±3",
]


def reference(analyzer: Analyzer, title: str, text: str) -> tuple[dict[str, tuple[int, int]], int, int]:
    """Each term's (frequency, the title's share), the text's terms and the title's, analysed one by one."""
    terms, title_terms = analyzer.analyze(f"{title}\n{text}"), analyzer.analyze(title)
    counts, in_title = Counter(terms), Counter(title_terms)
    return {t: (n, in_title[t]) for t, n in counts.items()}, len(terms), len(title_terms)


def coded(coder: TermCoder, analyzer: Analyzer, titles: list[str], texts: list[str]) -> list[tuple[dict, int, int]]:
    counts = coder.counts(analyzer, [f"{h}\n{t}" for h, t in zip(titles, texts)], titles)
    by_id = {i: t for t, i in coder.vocabulary.items()}
    out = []
    for c in counts:
        assert c.term_ids.dtype == np.int32 and np.all(np.diff(c.term_ids) > 0)  # distinct, ascending
        terms = {by_id[i]: (int(n), int(m)) for i, n, m in zip(c.term_ids.tolist(), c.tfs.tolist(), c.title_tfs.tolist())}
        out.append((terms, c.length, c.title_length))
    return out


ANALYZERS = [Analyzer(), Analyzer(stemmer="none", stopwords="none"), Analyzer(normalization="nfkc", fold_accents=True)]


@pytest.mark.parametrize("analyzer", ANALYZERS)
def test_a_batch_counts_what_one_by_one_analysis_counts(analyzer):
    coder = TermCoder({})
    expected = [reference(analyzer, h, t) for h, t in zip(TITLES, TEXTS)]
    assert coded(coder, analyzer, TITLES, TEXTS) == expected
    assert coded(coder, analyzer, TITLES[::-1], TEXTS[::-1]) == expected[::-1]  # the tokens remembered now
    assert coded(coder, analyzer, [], []) == []


def test_past_the_words_remembered_terms_are_still_counted(monkeypatch):
    monkeypatch.setattr(live_terms, "WORDS_REMEMBERED", 3)
    analyzer, coder = Analyzer(), TermCoder({})
    expected = [reference(analyzer, h, t) for h, t in zip(TITLES, TEXTS)]
    assert coded(coder, analyzer, TITLES, TEXTS) == expected
    full = dict(coder.known)  # the first batch filled it past its room: nothing is remembered after
    assert coded(coder, analyzer, ["Zebras"], ["quokkas graze"]) == [reference(analyzer, "Zebras", "quokkas graze")]
    assert coded(coder, analyzer, TITLES, TEXTS) == expected
    assert coder.known == full and "quokkas" not in coder.known


def test_another_analyzer_forgets_the_tokens_of_the_last():
    vocabulary: dict[str, int] = {}
    coder = TermCoder(vocabulary)
    coded(coder, Analyzer(), ["running"], ["runs"])
    plain = Analyzer(stemmer="none")
    ((terms, _, _),) = coded(coder, plain, ["running"], ["runs"])
    assert terms == {"running": (1, 1), "runs": (1, 0)}
    assert {"run", "running", "runs"} <= set(vocabulary)  # one vocabulary: the first analyzer's terms keep their ids


CHARACTERS = st.sampled_from(list("ab Z09_-.,;:'\"()[]\t\n\u00a0\u2013\u2003éßαµ±是の\U0001f600"))


@settings(max_examples=300, deadline=None)
@given(st.lists(CHARACTERS, max_size=40).map("".join))
def test_fast_tokens_are_the_regular_expressions(text):
    for pattern in (r"(?u)\b\w+\b", r"\w+"):
        analyzer = Analyzer(token_pattern=pattern, cjk="none")
        assert analyzer.tokens(text) == re.findall(pattern, text.lower())
