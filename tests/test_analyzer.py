import pytest
import Stemmer

from hybrid_retrieval.search import analyzer as analyzer_module
from hybrid_retrieval.search.analyzer import Analyzer, AnalyzerError


def test_default_analyzer_lowercases_drops_stopwords_and_stems():
    assert Analyzer().analyze("The Running of the Studies, in 2024!") == ["run", "studi", "2024"]


def test_single_characters_are_terms_and_english_stems_with_porter():
    assert Analyzer().analyze("a b c vitamin d, IL-6") == ["b", "c", "vitamin", "d", "il", "6"]  # "a" is a stop word
    assert Analyzer().analyze("dying generously") == ["dy", "gener"]  # Porter's; Snowball english says die, generous
    assert Analyzer.for_language("en") == Analyzer()


def test_a_word_porter_stems_to_nothing_is_no_term():
    assert Stemmer.Stemmer("porter").stemWord("s") == ""  # what Porter makes of a lone "s"
    assert Analyzer().analyze("S vitamin s's") == ["vitamin"]
    assert [term for term, _, _ in Analyzer().spans("S vitamin s")] == ["vitamin"]


def test_an_index_built_with_the_earlier_defaults_keeps_its_terms():
    earlier = Analyzer.from_dict({**Analyzer().to_dict(), "stemmer": "english", "token_pattern": r"(?u)\b\w\w+\b"})
    assert earlier.analyze("a b c vitamin d, dying generously") == ["vitamin", "die", "generous"]


@pytest.mark.parametrize("remembered", [0, 3, 10_000])
def test_remembered_stems_are_snowballs_whether_or_not_the_memory_is_full(monkeypatch, remembered):
    monkeypatch.setattr(analyzer_module, "STEM_CACHE_WORDS", remembered)
    words = "running runs runner studies studying ran running generously studies dying dying".split()
    analyzer = Analyzer(stopwords="none")
    snowball = Stemmer.Stemmer("porter").stemWords
    for batch in (words, words[::-1], words[3:] + ["novel", "running"], []):
        assert analyzer.analyze(" ".join(batch)) == snowball(batch)


def test_plain_analyzer_keeps_everything_but_case():
    plain = Analyzer(stopwords="none", stemmer="none")
    assert plain.analyze("The Running of") == ["the", "running", "of"]


def test_round_trip_through_manifest_dict():
    analyzer = Analyzer(stemmer="none")
    assert Analyzer.from_dict(analyzer.to_dict()) == analyzer
    assert analyzer.to_dict()["stopword_list"][:3] == ["a", "an", "and"]


def test_unknown_options_list_valid_values():
    with pytest.raises(AnalyzerError, match="unknown stemmer 'klingon'; valid: none, arabic"):
        Analyzer(stemmer="klingon")
    with pytest.raises(AnalyzerError, match="unknown analyzer fields"):
        Analyzer.from_dict({"lowercase": True, "shout": True})
