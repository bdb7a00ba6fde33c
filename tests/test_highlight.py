import itertools
import re

import numpy as np
import pytest

from hybrid_retrieval.common.errors import SpecError
from hybrid_retrieval.search.analyzer import Analyzer
from hybrid_retrieval.search.highlight import (
    DEFAULT_SNIPPET_CHARS,
    DEFAULT_SNIPPETS,
    Highlighter,
    Snippet,
    best_sentence,
    check_snippet_options,
    split_sentences,
)

STEMMED = Highlighter(Analyzer())
PLAIN = Highlighter(Analyzer(stemmer="none"))
TAG = re.compile(r"<[^>]*>")


def marked(snippet: Snippet) -> list[str]:
    return re.findall(r"<mark>(.*?)</mark>", snippet.text)


def test_stemmed_query_marks_every_inflection_at_its_offsets():
    text = "Bleeds often. Severe bleed."
    (snippet,) = STEMMED.highlight("bleeding", text)
    assert snippet.text == "<mark>Bleeds</mark> often. Severe <mark>bleed</mark>."
    assert (snippet.start, snippet.end) == (0, len(text))
    assert snippet.matches == [(0, 6), (text.index("bleed."), text.index("bleed.") + 5)] == [(0, 6), (21, 26)]
    assert snippet.terms == ["bleed"]
    assert snippet.to_dict() == {"text": snippet.text, "start": 0, "end": 27, "matches": [[0, 6], [21, 26]], "terms": ["bleed"]}


def test_unstemmed_analyzer_matches_only_the_same_word():
    (snippet,) = PLAIN.highlight("Bleeding", "Bleeding and bleeds; bleeding.")
    assert snippet.text == "<mark>Bleeding</mark> and bleeds; <mark>bleeding</mark>."
    assert snippet.terms == ["bleeding"]


@pytest.mark.parametrize(
    "text",
    [
        "The Running of the Studies, in 2024!",
        "Café naïve Ünïcödé résumé",
        "ΣΊΣΥΦΟΣ: Η ταχεία καφέ αλεπού",
        "東京タワー is tall; 日本語テキストmixed with English words",
        "émoji 🙂 bleeding ❤️ text, snake_case and CamelCase 42 x",
        "Straße STRASSE ǅemal ﬁne ＦＵＬＬ ｗｉｄｔｈ",
        "İstanbul hospitals report İİ bleeding cases",
        "",
    ],
)
@pytest.mark.parametrize(
    "analyzer",
    [
        Analyzer(),
        Analyzer(stemmer="none"),
        Analyzer(lowercase=False, stopwords="none"),
        Analyzer(cjk="none"),
        Analyzer(normalization="nfkc", fold_accents=True, stemmer="german", stopwords="german"),
    ],
)
def test_spans_are_the_analyzer_terms_at_their_offsets(analyzer, text):
    spans = analyzer.spans(text)
    assert [term for term, _, _ in spans] == analyzer.analyze(text)
    for term, start, end in spans:
        assert analyzer.analyze(text[start:end]) == [term]
        assert not text[start:end].isspace() and start < end
    assert [start for _, start, _ in spans] == sorted(start for _, start, _ in spans)


def test_spans_offsets_are_code_points():
    text = "🙂 Café naïve résumé bleeding"
    assert Analyzer().spans(text)[-1] == ("bleed", text.index("bleeding"), len(text)) == ("bleed", 20, 28)


def test_text_whose_lowercase_is_longer_still_highlights_at_original_offsets():
    text = "İstanbul hospitals report İİ bleeding cases"
    assert len(text.lower()) != len(text)
    spans = Analyzer().spans(text)
    # lower() makes 'İ' an 'i' and a combining dot, which ends a token: the terms are those BM25 indexed
    assert [term for term, _, _ in spans] == Analyzer().analyze(text) == ["i", "stanbul", "hospit", "report", "i", "i", "bleed", "case"]
    assert [text[start:end] for _, start, end in spans] == ["İ", "stanbul", "hospitals", "report", "İ", "İ", "bleeding", "cases"]
    assert spans[2] == ("hospit", 9, 18)
    (snippet,) = STEMMED.highlight("bleeding hospital", text)
    at = text.index("bleeding")
    assert snippet.matches == [(9, 18), (at, at + 8)]
    assert snippet.text == "İstanbul <mark>hospitals</mark> report İİ <mark>bleeding</mark> cases"


def test_every_occurrence_in_the_snippet_is_marked_in_order():
    text = "bleeding, then more Bleeding; bleeds and bleeding again"
    (snippet,) = STEMMED.highlight("bleeding", text)
    assert marked(snippet) == ["bleeding", "Bleeding", "bleeds", "bleeding"]
    assert snippet.matches == sorted(snippet.matches)
    assert [text[s:e] for s, e in snippet.matches] == marked(snippet)


def test_html_in_the_document_is_escaped_and_only_mark_tags_are_emitted():
    text = '<script>alert(1)</script> bleeding & <b>bold</b> <a href="x">link</a>'
    (snippet,) = STEMMED.highlight("bleeding bold", text)
    assert snippet.text == (
        "&lt;script&gt;alert(1)&lt;/script&gt; <mark>bleeding</mark> &amp; "
        "&lt;b&gt;<mark>bold</mark>&lt;/b&gt; "
        "&lt;a href=&quot;x&quot;&gt;link&lt;/a&gt;"
    )
    assert "<script>" not in snippet.text and "<b>" not in snippet.text
    assert set(TAG.findall(snippet.text)) == {"<mark>", "</mark>"}
    (inside_tag,) = STEMMED.highlight("scripts", text)
    assert inside_tag.text.startswith("&lt;<mark>script</mark>&gt;alert(1)&lt;/<mark>script</mark>&gt;")
    assert set(TAG.findall(inside_tag.text)) == {"<mark>", "</mark>"}


def test_a_short_field_is_one_snippet_of_the_whole_field_stripped():
    text = "  Bleeding risk of aspirin \n"
    snippets = STEMMED.highlight("aspirin bleeding", text, max_snippets=3)
    assert [s.text for s in snippets] == ["<mark>Bleeding</mark> risk of <mark>aspirin</mark>"]
    assert (snippets[0].start, snippets[0].end) == (2, 26)
    assert snippets[0].terms == ["aspirin", "bleed"]


def test_a_long_field_gives_a_window_around_the_matches_at_a_sentence_start():
    text = "Lorem ipsum dolor sit amet. " * 80 + "Severe bleeding follows aspirin use."
    (snippet,) = STEMMED.highlight("aspirin bleeding", text)
    assert snippet.end == len(text) and snippet.end - snippet.start <= DEFAULT_SNIPPET_CHARS
    expected = "Severe <mark>bleeding</mark> follows <mark>aspirin</mark> use."
    assert snippet.text == "…" + "Lorem ipsum dolor sit amet. " * 4 + expected
    assert text[snippet.start : snippet.end] == snippet.text[1:].replace("<mark>", "").replace("</mark>", "")


def test_windows_never_cut_words_and_stay_near_the_size():
    filler = " ".join(f"w{i % 97}x{'y' * (i % 7)}" for i in range(600))
    text = filler[:1000] + " first aspirin mention. " + filler[:900] + " bleeding and aspirin together " + filler[:500]
    longest = max(len(word) for word in text.split())
    for size in (20, 60, 160, 400):
        snippets = STEMMED.highlight("aspirin bleeding", text, snippet_chars=size, max_snippets=3)
        assert snippets
        for snippet in snippets:
            start, end = snippet.start, snippet.end
            assert end - start <= size + longest
            assert start == 0 or text[start - 1].isspace()
            assert end == len(text) or text[end].isspace()
            assert snippet.text.startswith("…") and snippet.text.endswith("…")
        spans = sorted((s.start, s.end) for s in snippets)
        assert all(a_end <= b_start for (_, a_end), (b_start, _) in itertools.pairwise(spans))


def test_a_match_inside_a_long_unbroken_run_is_not_cut_into():
    text = "x" * 300 + "/bleeding/" + "y" * 300
    (snippet,) = STEMMED.highlight("bleeding", text)
    assert snippet.text == "…/<mark>bleeding</mark>/…"
    assert (snippet.start, snippet.end) == (300, 310)


def test_two_snippets_best_first_and_not_overlapping():
    text = (
        "Aspirin reduces pain. "
        + "Filler words keep going here. " * 20
        + "Bleeding risk rises with aspirin dose. "
        + "More filler text for the tail. " * 10
    )
    first, second = STEMMED.highlight("aspirin bleeding", text, snippet_chars=120, max_snippets=2)
    assert first.terms == ["aspirin", "bleed"] and second.terms == ["aspirin"]
    assert first.start == text.index("Filler words keep going here. Bleeding")
    assert first.text == (
        "…Filler words keep going here. <mark>Bleeding</mark> risk rises with <mark>aspirin</mark> dose. "
        "More filler text for the tail. More filler text for…"
    )
    assert second.text == (
        "<mark>Aspirin</mark> reduces pain. Filler words keep going here. Filler words keep going here. "
        "Filler words keep going here. Filler…"
    )
    assert second.end <= first.start
    assert STEMMED.highlight("aspirin bleeding", text, snippet_chars=120, max_snippets=2) == [first, second]


def test_no_match_empty_field_or_stopword_only_query_gives_nothing():
    assert STEMMED.highlight("quantum", "Bleeds often.") == []
    assert STEMMED.highlight("the and of", "the and of it") == []
    assert STEMMED.highlight("bleeding", "") == []
    assert STEMMED.highlight("", "bleeding") == []


def test_precomputed_query_terms_replace_the_query():
    terms = STEMMED.query_terms("Bleeding AND aspirin")
    assert terms == frozenset({"bleed", "aspirin"})
    text = "aspirin then bleeding"
    assert STEMMED.highlight("", text, terms=terms) == STEMMED.highlight("bleeding aspirin", text)
    assert STEMMED.highlight("ignored", text, terms=terms)[0].terms == ["aspirin", "bleed"]


def test_check_snippet_options_names_the_field():
    assert check_snippet_options(DEFAULT_SNIPPET_CHARS, DEFAULT_SNIPPETS) == (160, 1)
    chars, count = check_snippet_options(300.0, 10)
    assert (chars, count) == (300, 10) and type(chars) is int
    for chars, count, field in [
        (19, 1, "snippet_chars"),
        (2001, 1, "snippet_chars"),
        (50.5, 1, "snippet_chars"),
        ("160", 1, "snippet_chars"),
        (160, 0, "snippets"),
        (160, 11, "snippets"),
        (160, True, "snippets"),
    ]:
        with pytest.raises(SpecError) as err:
            check_snippet_options(chars, count)
        assert err.value.field == field
    with pytest.raises(SpecError, match="snippet_chars: must be between 20 and 2000, got 5"):
        STEMMED.highlight("bleeding", "bleeding", snippet_chars=5)


def test_split_sentences():
    text = "First one. Second?  Third!\nFourth line\n\n  3.5 mg daily  "
    spans = split_sentences(text)
    assert [text[s:e] for s, e in spans] == ["First one.", "Second?", "Third!", "Fourth line", "3.5 mg daily"]
    assert spans[0] == (0, 10)
    assert split_sentences("  no boundary here ") == [(2, 18)]
    assert split_sentences("") == [] and split_sentences(" \n\n ") == []


def test_best_sentence_is_the_nearest_by_cosine():
    text = "Cats purr. Dogs bark & growl. a < b!"
    spans = split_sentences(text)
    vectors = np.array([[1.0, 0.0], [0.6, 0.8], [0.0, 1.0]], dtype=np.float32)
    best = best_sentence(text, spans, vectors, np.array([0.0, 1.0], dtype=np.float32))
    assert best == {"text": "a &lt; b!", "start": 30, "end": 36, "score": 1.0}
    best = best_sentence(text, spans, vectors, np.array([0.8, 0.6], dtype=np.float32))
    assert (best["text"], best["start"], best["end"]) == ("Dogs bark &amp; growl.", 11, 29)
    assert best["score"] == pytest.approx(0.96) and type(best["score"]) is float
    assert best_sentence("", [], np.zeros((0, 2)), np.array([1.0, 0.0])) is None
    with pytest.raises(ValueError, match="one vector per sentence"):
        best_sentence(text, spans, vectors[:2], np.array([1.0, 0.0]))
