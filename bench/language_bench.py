"""BM25 per language: how fast each analyzer turns text into terms at build time, how long a BM25 query takes, and
scifact's BM25 quality with the default (English) analyzer.

English is scifact itself. No corpus in another language is available offline, so each other language's documents
are drawn from a few seed sentences written for it (sentences picked at random, 8 to 16 a document): right for the
cost of tokenising, stemming and segmenting real words, not for ranking quality, and with a small vocabulary whose
long postings make its query latency an upper bound. Every configuration analyses the same number of documents, and
the configurations run interleaved, round after round, so that machine noise hits all alike.
"""

from __future__ import annotations

import importlib.util
import random
import statistics
import time

from bench.harness import Case, Table, percentiles
from hybrid_retrieval.indexer.corpus import read_corpus, split_queries
from hybrid_retrieval.indexer.datadir.settings import parse_analyzer
from hybrid_retrieval.quality.metrics import evaluate
from hybrid_retrieval.search.analyzer import Analyzer
from hybrid_retrieval.search.bm25 import BM25Index, BM25Params

SEEDS = {
    "german": [
        "Die Kinder spielten fröhlich in den Gärten der Häuser, während ihre Eltern spannende Bücher lasen.",
        "Die Forscher untersuchten die Wirkung des neuen Medikaments auf den Blutdruck älterer Patienten.",
        "Im Winter fahren viele Familien in die Berge, um Ski zu fahren und sich zu erholen.",
        "Die Regierung kündigte umfangreiche Investitionen in erneuerbare Energien und Bahnstrecken an.",
    ],
    "french": [
        "Les enfants jouaient joyeusement dans les jardins pendant que leurs parents lisaient des livres passionnants.",
        "Les chercheurs ont étudié les effets du nouveau médicament sur la pression artérielle des patients âgés.",
        "En hiver, de nombreuses familles partent à la montagne pour skier et se reposer.",
        "Le gouvernement a annoncé des investissements importants dans les énergies renouvelables et les chemins de fer.",
    ],
    "russian": [
        "Дети весело играли в садах, пока их родители читали интересные книги о путешествиях.",
        "Исследователи изучили влияние нового лекарства на кровяное давление пожилых пациентов.",
        "Зимой многие семьи уезжают в горы, чтобы кататься на лыжах и отдыхать.",
        "Правительство объявило о крупных инвестициях в возобновляемую энергетику и железные дороги.",
    ],
    "chinese": [
        "人工智能技术发展迅速，深度学习改变了计算机视觉和自然语言处理。",
        "研究人员研究了新药对老年患者血压的影响，并发表了详细的报告。",
        "冬天，许多家庭去山里滑雪和休息，享受宁静的假期。",
        "政府宣布对可再生能源和铁路建设进行大规模投资。",
    ],
    "japanese": [
        "東京大学の研究者が新しい量子コンピュータを発表し、多くの注目を集めた。",
        "研究者たちは新しい薬が高齢の患者の血圧に与える影響を調べた。",
        "冬になると、多くの家族がスキーと休養のために山へ出かける。",
        "政府は再生可能エネルギーと鉄道への大規模な投資を発表した。",
    ],
    "korean": [
        "서울에서 열린 회의에서 기후 변화 대책이 논의되었다.",
        "연구자들은 새로운 약이 노인 환자의 혈압에 미치는 영향을 조사했다.",
        "겨울이 되면 많은 가족들이 스키를 타고 휴식을 취하러 산으로 간다.",
        "정부는 재생 에너지와 철도에 대한 대규모 투자를 발표했다.",
    ],
}
# (language, label, analyzer settings, the module a segmenter needs)
CONFIGS = [
    ("english", "scifact, Porter (the English default)", {}, None),
    ("german", "Snowball german, its stop list", {"language": "german"}, None),
    ("french", "Snowball french, accents folded", {"language": "french", "fold_accents": True}, None),
    ("russian", "Snowball russian", {"language": "russian"}, None),
    ("chinese", "bigrams", {"language": "chinese"}, None),
    ("chinese", "jieba", {"language": "chinese", "cjk": "jieba"}, "jieba"),
    ("japanese", "bigrams", {"language": "japanese"}, None),
    ("japanese", "SudachiPy", {"language": "japanese", "cjk": "sudachi"}, "sudachipy"),
    ("korean", "bigrams", {"language": "korean"}, None),
    ("korean", "Kiwi", {"language": "korean", "cjk": "kiwi"}, "kiwipiepy"),
]


def _documents(language: str, count: int, data) -> list[str]:
    if language == "english":
        return [doc.indexed_text for doc, _ in zip(read_corpus(data), range(count), strict=False)]
    rng = random.Random(language)
    return [" ".join(rng.choices(SEEDS[language], k=rng.randint(8, 16))) for _ in range(count)]


def _queries(language: str, count: int, data) -> list[str]:
    if language == "english":
        return list(split_queries(data, "test")[0].values())[:count]
    rng = random.Random(language + "/queries")
    # a query is a piece of a seed sentence: 4 to 8 characters of CJK, 2 to 3 words otherwise
    queries = []
    for _ in range(count):
        sentence = rng.choice(SEEDS[language])
        if language in ("chinese", "japanese"):
            start = rng.randrange(len(sentence) - 8)
            queries.append(sentence[start : start + rng.randint(4, 8)])
        else:
            words = sentence.split()
            start = rng.randrange(len(words) - 3)
            queries.append(" ".join(words[start : start + rng.randint(2, 3)]))
    return queries


def _scifact_bm25_ndcg(data) -> float:
    """BM25 with the default analyzer over the whole corpus, test split: the figure English must keep."""
    analyzer = Analyzer()
    ids, tokens = [], []
    for doc in read_corpus(data):
        ids.append(doc.doc_id)
        tokens.append(analyzer.analyze(doc.indexed_text))
    index = BM25Index.build(tokens, analyzer, BM25Params())
    queries, qrels = split_queries(data, "test")
    run = {}
    for qid, text in queries.items():
        ranking = index.search(text, 100)
        run[qid] = {ids[i]: float(s) for i, s in zip(ranking.doc_idx, ranking.scores, strict=True)}
    return evaluate(run, qrels, ["ndcg@10"])["ndcg@10"]


def _languages(ctx) -> list[Table]:
    count, rounds = ctx.size(5000, 300), ctx.size(3, 1)
    configs = [c for c in CONFIGS if c[3] is None or importlib.util.find_spec(c[3]) is not None]
    skipped = [f"{c[0]} {c[1]}" for c in CONFIGS if c not in configs]
    prepared = []
    for language, label, settings, _ in configs:
        analyzer = parse_analyzer(settings, "analyzer")
        docs, queries = _documents(language, count, ctx.data), _queries(language, 200, ctx.data)
        analyzer.analyze(docs[0])  # a segmenter loads its dictionary once, outside the timings
        prepared.append((language, label, analyzer, docs, queries))
    analysis: dict[str, list[float]] = {}
    builds: dict[str, list[float]] = {}
    latencies: dict[str, list[float]] = {}
    tokens_of: dict[str, int] = {}
    for _ in range(rounds):
        for language, label, analyzer, docs, queries in prepared:
            key = f"{language} / {label}"
            started = time.perf_counter()
            tokens = [analyzer.analyze(doc) for doc in docs]
            analysis.setdefault(key, []).append(time.perf_counter() - started)
            started = time.perf_counter()
            index = BM25Index.build(tokens, analyzer, BM25Params())
            builds.setdefault(key, []).append(time.perf_counter() - started)
            tokens_of[key] = sum(map(len, tokens))
            for query in queries:
                started = time.perf_counter()
                index.search(query, 100)
                latencies.setdefault(key, []).append((time.perf_counter() - started) * 1000)
    english = statistics.median(analysis[f"english / {CONFIGS[0][1]}"])
    rows = []
    for language, label, _, docs, _ in prepared:
        key = f"{language} / {label}"
        seconds = statistics.median(analysis[key])
        rows.append(
            {
                "language": language,
                "analyzer": label,
                "documents": len(docs),
                "terms": tokens_of[key],
                "analysis terms/s": round(tokens_of[key] / seconds),
                "analysis documents/s": round(len(docs) / seconds),
                "time vs english": round(seconds / english, 2),
                "BM25 build s": round(statistics.median(builds[key]), 3),
                "query p50 ms": percentiles(latencies[key])["p50_ms"],
                "query p99 ms": percentiles(latencies[key])["p99_ms"],
            }
        )
    note = (
        f"Medians of {rounds} interleaved rounds; 200 queries a configuration, top 100, in process. English is the "
        f"first {count} scifact documents and its test queries; other languages are drawn from seed sentences "
        "(bench/language_bench.py), so only their speed is meaningful."
    )
    if skipped:
        note += f" Not run (segmenter not installed): {', '.join(skipped)}."
    quality = [
        {
            "analyzer": "default (english, Lucene stop list, CJK bigrams)",
            "scifact test BM25 nDCG@10": round(_scifact_bm25_ndcg(ctx.data), 4),
        }
    ]
    return [
        Table("analysis and BM25 speed per language", rows, note),
        Table("English quality with the default analyzer (must stay 0.6863)", quality),
    ]


CASES = [
    Case(
        "Quality",
        "Languages",
        "BM25 per language: analysis terms/s at build, BM25 build time, query latency; scifact BM25 with the default analyzer",
        _languages,
    )
]
