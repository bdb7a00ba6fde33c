"""Text analysis beyond English, against reference outputs: Snowball stemming against snowballstemmer (the Snowball
project's own pure-Python build, an implementation independent of PyStemmer's C), stop words against the stop-words
package's lists, CJK bigrams against Lucene's CJKAnalyzer test outputs, each dictionary segmenter against its
documented example; then BM25 over Chinese, Japanese, Korean and mixed text, synonyms, and the manifest check."""

from __future__ import annotations

import re

import numpy as np
import pytest
import snowballstemmer
import stop_words

from hybrid_retrieval.common.errors import SpecError
from hybrid_retrieval.search.analyzer import Analyzer, AnalyzerError
from hybrid_retrieval.search.bm25 import BM25Index, BM25Params
from hybrid_retrieval.search.cjk import bigrams
from hybrid_retrieval.search.highlight import Highlighter
from hybrid_retrieval.search.synonyms import Synonyms

# one sentence a language, of inflected words (plurals, past tenses, cases) for the stemmers to work on
SENTENCES = {
    "german": "Die Kinder spielten fröhlich in den Gärten der Häuser, während ihre Eltern spannende Bücher lasen",
    "french": "Les enfants jouaient joyeusement dans les jardins pendant que leurs parents lisaient des livres passionnants",
    "spanish": "Los niños jugaban alegremente en los jardines mientras sus padres leían libros interesantes",
    "italian": "I bambini giocavano allegramente nei giardini mentre i loro genitori leggevano libri interessanti",
    "portuguese": "As crianças brincavam alegremente nos jardins enquanto os seus pais liam livros interessantes",
    "dutch": "De kinderen speelden vrolijk in de tuinen terwijl hun ouders interessante boeken lazen",
    "swedish": "Barnen lekte glatt i trädgårdarna medan deras föräldrar läste intressanta böcker",
    "danish": "Børnene legede glade i haverne, mens deres forældre læste interessante bøger",
    "norwegian": "Barna lekte glade i hagene mens foreldrene deres leste interessante bøker",
    "finnish": "Lapset leikkivät iloisesti puutarhoissa, kun heidän vanhempansa lukivat mielenkiintoisia kirjoja",
    "russian": "Дети весело играли в садах, пока их родители читали интересные книги о путешествиях",
    "hungarian": "A gyerekek vidáman játszottak a kertekben, miközben szüleik érdekes könyveket olvastak",
    "turkish": "Çocuklar bahçelerde neşeyle oynarken ebeveynleri ilginç kitaplar okuyorlardı",
    "romanian": "Copiii se jucau veseli în grădini în timp ce părinții lor citeau cărți interesante",
    "greek": "Τα παιδιά έπαιζαν χαρούμενα στους κήπους ενώ οι γονείς τους διάβαζαν ενδιαφέροντα βιβλία",
    "arabic": "كان الأطفال يلعبون بسعادة في الحدائق بينما كان آباؤهم يقرؤون كتبا مثيرة",
}
WORD = re.compile(r"\w+")


@pytest.mark.parametrize("language", sorted(SENTENCES))
def test_stemming_matches_the_snowball_reference(language):
    # the sentence and every word of the language's stop list: a few hundred real words for most languages
    listed = stop_words.get_stop_words(language) if language in stop_words.AVAILABLE_LANGUAGES else []
    text = " ".join([SENTENCES[language], *listed])
    words = WORD.findall(text.lower())
    analyzer = Analyzer(stemmer=language, stopwords="none", cjk="none")
    stems = snowballstemmer.stemmer(language).stemWords(words)
    assert analyzer.analyze(text) == [stem for stem in stems if stem]  # a word stemmed to nothing is no term
    assert len(set(analyzer.analyze(SENTENCES[language])) - set(WORD.findall(SENTENCES[language].lower()))) >= 3  # it stems


@pytest.mark.parametrize("language", sorted(set(SENTENCES) & set(stop_words.AVAILABLE_LANGUAGES)))
def test_a_language_drops_exactly_its_stop_list(language):
    analyzer = Analyzer.for_language(language)
    listed = stop_words.get_stop_words(language)
    assert analyzer.stemmer == language and analyzer.stopword_list == tuple(listed)
    for word in listed:  # every listed word that is one token is dropped whole
        if WORD.fullmatch(word.lower()):
            assert analyzer.analyze(word) == [], word
    kept = [w for w in WORD.findall(SENTENCES[language].lower()) if w not in set(listed)]
    assert analyzer.analyze(SENTENCES[language]) == snowballstemmer.stemmer(language).stemWords(kept)


def test_languages_by_name_or_code_and_what_they_refuse():
    assert Analyzer.for_language("de") == Analyzer.for_language("german")
    assert Analyzer.for_language("english") == Analyzer()  # Lucene's short English list, as before
    assert Analyzer.for_language("zh") == Analyzer(stemmer="none", stopwords="none")
    with pytest.raises(AnalyzerError, match="unknown language 'klingon'; valid: arabic"):
        Analyzer.for_language("klingon")
    with pytest.raises(AnalyzerError, match="unknown stemmer 'klingon'; valid: none, arabic"):
        Analyzer(stemmer="klingon")
    with pytest.raises(AnalyzerError, match="unknown cjk 'mecab'; valid: bigram, jieba, sudachi, kiwi, none"):
        Analyzer(cjk="mecab")
    with pytest.raises(AnalyzerError, match="needs a stopword_list"):
        Analyzer(stopwords="custom")
    custom = Analyzer(stopwords="custom", stopword_list=("Foo", "bar"))
    assert custom.analyze("foo BAR bazzes") == ["bazz"]


# Lucene's TestCJKAnalyzer and TestCJKBigramFilter: the sentence, its terms, where each starts
LUCENE_CJK = [
    ("一二三四五六七八九十", ["一二", "二三", "三四", "四五", "五六", "六七", "七八", "八九", "九十"], [0, 1, 2, 3, 4, 5, 6, 7, 8]),
    ("一 二三四 五六七八九 十", ["一", "二三", "三四", "五六", "六七", "七八", "八九", "十"], [0, 2, 3, 6, 7, 8, 9, 12]),
    ("あいうえおabcかきくけこ", ["あい", "いう", "うえ", "えお", "abc", "かき", "きく", "くけ", "けこ"], [0, 1, 2, 3, 5, 8, 9, 10, 11]),
    ("あいtest", ["あい", "test"], [0, 2]),
    ("testあい    ", ["test", "あい"], [0, 4]),
    ("一 روبرت موير", ["一", "روبرت", "موير"], [0, 2, 8]),
    (
        "多くの学生が試験に落ちた。",
        ["多く", "くの", "の学", "学生", "生が", "が試", "試験", "験に", "に落", "落ち", "ちた"],
        list(range(11)),
    ),
    ("一丁丂", ["一丁", "丁丂"], [0, 1]),
]


@pytest.mark.parametrize(("text", "terms", "starts"), LUCENE_CJK)
def test_cjk_bigrams_are_lucenes(text, terms, starts):
    analyzer = Analyzer.for_language("japanese")
    spans = analyzer.spans(text)
    assert [t for t, _, _ in spans] == analyzer.analyze(text) == terms
    assert [s for _, s, _ in spans] == starts
    assert all(text[s:e].lower() == t for t, s, e in spans)  # each term is the text it marks


def test_lucenes_mixed_script_example():
    # Lucene: あい いう うえ えお ab ん c かき きく くけ こ
    assert Analyzer.for_language("ja").analyze("あいうえおabんcかきくけ こ") == [
        "あい",
        "いう",
        "うえ",
        "えお",
        "ab",
        "ん",
        "c",
        "かき",
        "きく",
        "くけ",
        "こ",
    ]
    # supplementary-plane ideographs are one character each (Lucene's testSurrogates)
    assert bigrams("𩬅艱鍟䇹愯瀛") == [("𩬅艱", 0, 2), ("艱鍟", 1, 3), ("鍟䇹", 2, 4), ("䇹愯", 3, 5), ("愯瀛", 4, 6)]


def test_english_text_is_analysed_as_before_cjk_handling():
    legacy = Analyzer.from_dict({k: v for k, v in Analyzer().to_dict().items() if k not in ("cjk", "normalization", "fold_accents")})
    assert legacy.cjk == "none" and legacy.analyze("人工智能技术发展迅速") == ["人工智能技术发展迅速"]  # one token, as it was
    assert Analyzer().analyze("人工智能技术发展迅速") == ["人工", "工智", "智能", "能技", "技术", "术发", "发展", "展迅", "迅速"]
    text = "The Running of the Studies, in 2024! İstanbul ﬁne"
    assert Analyzer().analyze(text) == legacy.analyze(text) == ["run", "studi", "2024", "i", "stanbul", "ﬁne"]


def test_normalisation_and_accent_folding():
    folded = Analyzer(normalization="nfkc", fold_accents=True, stemmer="french", stopwords="french")
    assert folded.analyze("Ｃａｆé naïve ﬁne") == folded.analyze("cafe naive fine") == ["caf", "naiv", "fin"]
    assert Analyzer(stemmer="french", stopwords="french").analyze("café naïve") != Analyzer(stemmer="french").analyze("cafe naive")
    # kana keep their voicing marks (folding が to か would merge different words)
    assert Analyzer(fold_accents=True).analyze("がか") == ["がか"]
    # offsets stay on the original text when normalising changes its length
    spans = folded.spans("ﬁne Ｃａｆé")
    assert spans == [("fin", 0, 3), ("caf", 4, 8)]


segmenters = pytest.mark.parametrize(
    ("cjk", "module", "text", "terms"),
    [
        # jieba's README, precise mode: 我/ 来到/ 北京/ 清华大学 and 他/ 来到/ 了/ 网易/ 杭研/ 大厦 (杭研 found by its HMM)
        ("jieba", "jieba", "我来到北京清华大学", ["我", "来到", "北京", "清华大学"]),
        ("jieba", "jieba", "他来到了网易杭研大厦", ["他", "来到", "了", "网易", "杭研", "大厦"]),
        # SudachiPy's README: 国家公務員 in mode A is 国家 / 公務 / 員; Kuromoji's test sentence, particles dropped
        ("sudachi", "sudachipy", "国家公務員", ["国家", "公務", "員"]),
        ("sudachi", "sudachipy", "多くの学生が試験に落ちた。", ["多く", "学生", "試験", "落ちる"]),
        # Kiwi tags 한국어/NNP 형태소/NNG 분석기/NNG 를/JKO 사용/NNG 하/XSV ᆸ니다/EF: the particle, suffix, ending go
        ("kiwi", "kiwipiepy", "한국어 형태소 분석기를 사용합니다.", ["한국어", "형태소", "분석기", "사용"]),
    ],
)


@segmenters
def test_each_segmenter_cuts_its_documented_example(cjk, module, text, terms):
    pytest.importorskip(module)
    analyzer = Analyzer(cjk=cjk, stemmer="none", stopwords="none")
    assert analyzer.analyze(text) == terms
    assert [t for t, _, _ in analyzer.spans(text)] == terms


@segmenters
def test_a_segmenter_leaves_other_scripts_to_bigrams_and_words(cjk, module, text, terms):
    pytest.importorskip(module)
    analyzer = Analyzer(cjk=cjk, stemmer="none", stopwords="none")
    mixed = f"Hybrid search {text} 한국어 かなカナ"
    found = analyzer.analyze(mixed)
    assert found[:2] == ["hybrid", "search"] and found[2 : 2 + len(terms)] == terms
    assert all(0 <= start < end <= len(mixed) for _, start, end in analyzer.spans(mixed))


DOCS = [
    "人工智能技术发展迅速，深度学习改变了计算机视觉。",  # Chinese: AI develops fast, deep learning changed vision
    "東京大学の研究者が新しい量子コンピュータを発表した。",  # Japanese: Tokyo researchers announce a quantum computer
    "서울에서 열린 회의에서 기후 변화 대책이 논의되었다.",  # Korean: climate measures discussed at a Seoul meeting
    "The quantum 计算机 (computer) was built in 东京 by researchers.",  # mixed English and Chinese
    "Maple syrup is made from the sap of maple trees.",
]


def bm25(analyzer: Analyzer) -> BM25Index:
    return BM25Index.build([analyzer.analyze(d) for d in DOCS], analyzer, BM25Params())


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("人工智能", 0),
        ("深度学习", 0),
        ("量子コンピュータ", 1),
        ("研究者", 1),
        ("기후 변화", 2),
        ("회의", 2),
        ("计算机", 3),
        ("quantum", 3),
        ("maple", 4),
    ],
)
def test_cjk_queries_find_their_document(query, expected):
    index = bm25(Analyzer())
    scores = index.scores(query)
    assert int(np.argmax(scores)) == expected and scores[expected] > 0


@pytest.mark.parametrize("query", ["人工智能", "深度学习", "量子コンピュータ", "研究者", "회의"])
def test_before_cjk_analysis_these_queries_found_nothing(query):
    # a CJK run was one token: a query matched only a whole run between spaces or punctuation (회의에서 is not 회의)
    assert not bm25(Analyzer(cjk="none")).scores(query).any()


@pytest.mark.parametrize(("cjk", "module"), [("jieba", "jieba"), ("sudachi", "sudachipy"), ("kiwi", "kiwipiepy")])
def test_segmenter_indexes_find_their_documents(cjk, module):
    pytest.importorskip(module)
    index = bm25(Analyzer(cjk=cjk))
    expected = {"jieba": ("深度学习", 0), "sudachi": ("研究者", 1), "kiwi": ("기후 변화", 2)}[cjk]
    assert int(np.argmax(index.scores(expected[0]))) == expected[1]


def test_chinese_highlights_mark_the_right_characters():
    text = DOCS[3]
    (snippet,) = Highlighter(Analyzer()).highlight("计算机", text)
    # its bigrams 计算 and 算机 overlap: one mark over the three characters, the text unchanged around it
    assert [text[s:e] for s, e in snippet.matches] == ["计算机"]
    assert snippet.text == "The quantum <mark>计算机</mark> (computer) was built in 东京 by researchers."
    (snippet,) = Highlighter(Analyzer()).highlight("学生 落ちた", "多くの学生が試験に落ちた。")
    assert snippet.text == "多くの<mark>学生</mark>が試験に<mark>落ちた</mark>。" and snippet.terms == ["ちた", "学生", "落ち"]


def test_synonyms_expand_queries_both_ways_or_one():
    analyzer = Analyzer()
    synonyms = Synonyms(
        [{"equivalent": ["car", "automobiles"]}, {"from": "heart attack", "to": ["myocardial infarction", "MI"]}], analyzer.analyze
    )
    assert synonyms.expand(analyzer.analyze("red cars")) == ["red", "car", "automobil"]
    assert synonyms.expand(analyzer.analyze("automobile prices")) == ["automobil", "price", "car"]
    assert synonyms.expand(analyzer.analyze("heart attacks at night")) == ["heart", "attack", "night", "myocardi", "infarct", "mi"]
    assert synonyms.expand(analyzer.analyze("myocardial infarction")) == ["myocardi", "infarct"]  # one way
    assert synonyms.expand(analyzer.analyze("attack heart")) == ["attack", "heart"]  # a phrase matches in order only
    with pytest.raises(SpecError, match=r"synonyms\[0\].equivalent: needs at least two phrases"):
        Synonyms([{"equivalent": ["car"]}], analyzer.analyze)
    with pytest.raises(SpecError, match=r"synonyms\[1\]: 'the' analyses to no terms"):
        Synonyms([{"equivalent": ["a car", "auto"]}, {"from": "the", "to": ["car"]}], analyzer.analyze)


def test_synonyms_change_bm25_without_a_rebuild():
    analyzer = Analyzer()
    index = bm25(analyzer)
    assert not index.scores("sirup").any()
    analyzer.set_synonyms([{"from": "sirup", "to": ["syrup"]}])
    assert np.array_equal(index.scores("sirup"), index.scores("syrup")) and index.scores("sirup")[4] > 0
    analyzer.set_synonyms([])
    assert not index.scores("sirup").any()


def test_bm25_refuses_a_manifest_that_names_another_analyzer(tmp_path):
    german = Analyzer.for_language("german")
    BM25Index.build([german.analyze(d) for d in DOCS], german, BM25Params()).save(tmp_path)
    assert BM25Index.load(tmp_path, Analyzer.for_language("de")).num_docs == len(DOCS)
    with pytest.raises(AnalyzerError, match="differs in stemmer, stopword_list, stopwords"):
        BM25Index.load(tmp_path, Analyzer())


def test_an_index_of_a_segmenter_that_is_not_installed_is_refused_by_name(monkeypatch, tiny_index):
    import json

    from hybrid_retrieval.indexer.manifest import MANIFEST, IndexOpenError, Manifest
    from hybrid_retrieval.search import cjk

    manifest = json.loads((tiny_index / MANIFEST).read_text())
    manifest["analyzer"]["cjk"] = "jieba"
    monkeypatch.setattr(cjk.Jieba, "modules", ("jieba_is_not_installed",))
    cjk.segmenter.cache_clear()
    try:
        with pytest.raises(AnalyzerError, match=r"needs the jieba_is_not_installed package: pip install 'hybrid-retrieval\[zh\]'"):
            Analyzer(cjk="jieba")
        with pytest.raises(IndexOpenError, match=r"pip install 'hybrid-retrieval\[zh\]'"):
            Manifest.from_dict(manifest)
    finally:
        cjk.segmenter.cache_clear()
