"""Steering the ranking: typo tolerance, measured on the dataset's test queries and a misspelt copy of them; boosts,
sorts and pins, timed against the plain search on the corpus with synthetic metadata (bench.filter_bench).

The typo set (`misspelt`): each test query with one edit in its rarest word of five letters or more (by the document
frequency of the word's term in the index; the first such word on a tie): two adjacent letters swapped at a position
drawn from the query id, so every run misspells alike. Measured in one run on the untuned index: nDCG@10 of the BM25
and hybrid modes on the clean and the misspelt queries with `typo` 0 and "auto", and the search's p50 (one thread, k
10, the modes and settings interleaved query by query) with and without it.
"""

from __future__ import annotations

import re
import zlib

import numpy as np

from bench.filter_bench import metadata_index
from bench.harness import Case, Table, interleaved, percentiles
from hybrid_retrieval.indexer.corpus import split_queries
from hybrid_retrieval.indexer.store import OpenIndex, open_index
from hybrid_retrieval.quality.metrics import evaluate, per_query_scores
from hybrid_retrieval.quality.significance import randomization_test
from hybrid_retrieval.search.curation import Curation
from hybrid_retrieval.training.fields import label, tune_text_fields

WORD = re.compile(r"[^\W\d_]{5,}")  # letters only, five or more
MODES = ("bm25", "hybrid")
TYPOS = (0, "auto")


def misspelt(query_id: str, text: str, index: OpenIndex) -> str:
    """`text` with two adjacent letters of its rarest long word swapped (unchanged when no long word is in the index)."""
    bm25, rng = index.bm25, np.random.default_rng(zlib.crc32(query_id.encode()))
    held = []
    for match in WORD.finditer(text):
        terms = bm25.analyzer.analyze(match.group())
        if len(terms) == 1 and terms[0] in bm25.vocabulary:
            held.append((bm25.df(terms[0]), match.start(), match.group()))
    if not held:
        return text
    _, start, word = min(held)
    swaps = [i for i in range(len(word) - 1) if word[i] != word[i + 1]]  # a swap of like letters changes nothing
    at = swaps[int(rng.integers(len(swaps)))]
    return text[:start] + word[:at] + word[at + 1] + word[at] + word[at + 2 :] + text[start + len(word) :]


def _typos(ctx) -> list[Table]:
    index = open_index(ctx.untuned_index)
    pipeline = index.pipeline()
    test, qrels = split_queries(ctx.data, "test")
    test = dict(list(test.items())[: ctx.size(len(test), 40)])
    sets = {"clean": test, "misspelt": {qid: misspelt(qid, text, index) for qid, text in test.items()}}
    changed = sum(sets["misspelt"][qid] != text for qid, text in test.items())
    vectors = {name: dict(zip(queries, index.query_embedder.encode(list(queries.values())))) for name, queries in sets.items()}

    def search(name: str, qid: str, mode: str, typo: str | int):
        return pipeline.search(sets[name][qid], 10, {"mode": mode, "typo": typo}, vector=vectors[name][qid] if mode == "hybrid" else None)

    quality_rows, latency_rows = [], []
    ndcg: dict[tuple, float] = {}
    for name in sets:
        for mode in MODES:
            for typo in TYPOS:
                run = {}
                for qid in test:
                    ranking = search(name, qid, mode, typo).ranking
                    run[qid] = {index.doc_ids[i]: float(s) for i, s in zip(ranking.doc_idx.tolist(), ranking.scores.tolist())}
                ndcg[name, mode, typo] = evaluate(run, qrels, ("ndcg@10",))["ndcg@10"]
        for mode in MODES:
            calls = {typo: (lambda qid, m=mode, t=typo, n=name: search(n, qid, m, t)) for typo in TYPOS}
            times = interleaved(calls, list(test))
            p50 = {typo: percentiles(times[typo])["p50_ms"] for typo in TYPOS}
            latency_rows.append(
                {
                    "queries": name,
                    "mode": mode,
                    "p50 ms, typo 0": p50[0],
                    'p50 ms, typo "auto"': p50["auto"],
                    "auto / 0": round(p50["auto"] / p50[0], 3),
                    'p99 ms, typo "auto"': percentiles(times["auto"])["p99_ms"],
                }
            )
    for mode in MODES:
        clean = ndcg["clean", mode, 0]
        quality_rows.append(
            {
                "mode": mode,
                "clean, typo 0": round(clean, 4),
                'clean, typo "auto"': round(ndcg["clean", mode, "auto"], 4),
                "misspelt, typo 0": round(ndcg["misspelt", mode, 0], 4),
                'misspelt, typo "auto"': round(ndcg["misspelt", mode, "auto"], 4),
                "misspelt / clean, typo 0": round(ndcg["misspelt", mode, 0] / clean, 3),
                'misspelt / clean, typo "auto"': round(ndcg["misspelt", mode, "auto"] / clean, 3),
                'clean: "auto" - 0': round(ndcg["clean", mode, "auto"] - clean, 4),
            }
        )
    note = (
        f"nDCG@10 of {len(test)} test queries ({changed} misspelt: two adjacent letters of the rarest word of five letters "
        "or more swapped), untuned index; hybrid is the default fusion."
    )
    latency_note = "pipeline.search in process, k 10, one thread; typo 0 and auto interleaved query by query."
    return [Table("Typo tolerance: quality", quality_rows, note), Table("Typo tolerance: latency", latency_rows, latency_note)]


# What an application adds to a hybrid search: freshness by two decays (a date and a number), a sort by date, pins.
RECENCY = [
    {"decay": "gauss", "field": "published", "origin": "2019-06-01", "scale": "1000d", "offset": "30d", "weight": 0.3},
    {"decay": "exp", "field": "year", "origin": 2019, "scale": 5, "weight": 0.2},
]
STEERED = {
    "plain": {},
    "two decay boosts": {"boosts": RECENCY},
    "sorted by date": {"sort": [{"field": "published", "order": "desc"}]},
}


def _boosts(ctx) -> list[Table]:
    index = metadata_index(ctx.data, ctx.work / "metadata")
    pipeline = index.pipeline()
    test, _ = split_queries(ctx.data, "test")
    queries = list(test.items())[: ctx.size(len(test), 40)]
    vectors = dict(zip([qid for qid, _ in queries], index.query_embedder.encode([text for _, text in queries])))
    texts = dict(queries)
    pins = Curation(pinned=tuple(index.doc_ids[:3]))

    def search(qid: str, mode: str, spec: dict, curation: Curation | None = None):
        return pipeline.search(texts[qid], 10, {"mode": mode, **spec}, vector=vectors[qid] if mode == "hybrid" else None, curation=curation)

    rows = []
    for mode in ("hybrid", "bm25"):
        calls = {name: (lambda qid, m=mode, s=spec: search(qid, m, s)) for name, spec in STEERED.items()}
        calls["three pins"] = lambda qid, m=mode: search(qid, m, {}, pins)
        if mode == "hybrid":  # as a served search costs: the query embedded too
            calls["plain, query embedded"] = lambda qid: pipeline.search(texts[qid], 10, {"mode": "hybrid"})
            calls["two decay boosts, query embedded"] = lambda qid: pipeline.search(texts[qid], 10, {"mode": "hybrid", "boosts": RECENCY})
        times = interleaved(calls, list(texts))
        plain = percentiles(times["plain"])["p50_ms"]
        embedded = percentiles(times["plain, query embedded"])["p50_ms"] if mode == "hybrid" else None
        for name, samples in times.items():
            p = percentiles(samples)
            ratio = round(p["p50_ms"] / (embedded if "embedded" in name and embedded else plain), 3)
            rows.append({"mode": mode, "search": name, "p50 ms": p["p50_ms"], "p99 ms": p["p99_ms"], "p50 / plain": ratio})
    note = (
        f"{len(texts)} test queries, pipeline.search in process with the query vectors given (embedding is the same for "
        f"all; the rows 'query embedded' embed it, against the plain search embedding it), k 10, depth 100, one thread, the "
        f"searches interleaved query by query; {index.num_docs} documents with "
        f"synthetic metadata. Decays: {RECENCY}."
    )
    return [Table("Boosts, sort and pins: latency", rows, note)]


def _fields(ctx) -> list[Table]:
    index = open_index(ctx.untuned_index)
    pipeline = index.pipeline()
    train, train_qrels = split_queries(ctx.data, "train")
    test, test_qrels = split_queries(ctx.data, "test")
    chosen, evidence = tune_text_fields(pipeline, index.doc_ids, train, train_qrels, "train", progress=False)
    fitted = max((c for c in evidence["candidates"] if c != "one field"), key=evidence["candidates"].__getitem__)
    fitted_fields = {"title": float(fitted.split()[1].rstrip(",")), "text": 1.0}
    vectors = dict(zip(test, index.query_embedder.encode(list(test.values()))))
    rows = []
    for mode in ("bm25", "hybrid"):
        scores = {}
        for name, text_fields in (("one field", None), (label(fitted_fields), fitted_fields)):
            run = {}
            for qid, text in test.items():
                vector = vectors[qid] if mode == "hybrid" else None
                ranking = pipeline.search(text, 100, {"mode": mode, "text_fields": text_fields}, vector=vector).ranking
                run[qid] = {index.doc_ids[i]: float(s) for i, s in zip(ranking.doc_idx.tolist(), ranking.scores.tolist())}
            per_query = per_query_scores(run, test_qrels, ("ndcg@10",))["ndcg@10"]
            scores[name] = np.array([per_query[q] for q in sorted(per_query)])
        one, weighted = scores["one field"], scores[label(fitted_fields)]
        rows.append(
            {
                "mode": mode,
                "test nDCG@10, one field": round(float(one.mean()), 4),
                f"test nDCG@10, BM25F {label(fitted_fields)}": round(float(weighted.mean()), 4),
                "difference": round(float((weighted - one).mean()), 4),
                "paired p": round(randomization_test(weighted, one), 4),
            }
        )
    latency = []
    for mode in ("bm25", "hybrid"):
        calls = {
            name: (lambda qid, m=mode, f=text_fields: pipeline.search(test[qid], 10, {"mode": m, "text_fields": f}, vector=vectors[qid]))
            for name, text_fields in (("one field", None), ("fields", fitted_fields))
        }
        times = interleaved(calls, list(test))
        p50 = {name: percentiles(samples)["p50_ms"] for name, samples in times.items()}
        ratio = round(p50["fields"] / p50["one field"], 3)
        latency.append({"mode": mode, "p50 ms, one field": p50["one field"], "p50 ms, fields": p50["fields"], "fields / one field": ratio})
    tuning = [{"candidate": name, "train nDCG@10 (BM25)": value} for name, value in evidence["candidates"].items()]
    values = evidence["values"]
    decision = (
        f"`hybrid tune`'s rule on train ({evidence['queries']} queries, 5-fold cross-validated {values['tuned, cross-validated']} "
        f"against one field's {values['untuned one field']}, p {evidence['p']}): {evidence['decision']}"
        f"{'' if chosen is None else ', ' + label(chosen)}. Test: the weights best on train, against one field."
    )
    latency_note = "pipeline.search in process, k 10, query vectors given, one thread, interleaved query by query"
    return [
        Table("Field weights: chosen on train", tuning, decision),
        Table("Field weights: test", rows, "untuned index, default fusion"),
        Table("Field weights: latency", latency, latency_note),
    ]


CASES = [
    Case(
        "Steer the ranking",
        "Field weights",
        "BM25F title weights fitted on the train queries as `hybrid tune` does, then test nDCG@10 against one field",
        _fields,
    ),
    Case(
        "Steer the ranking",
        "Boosts and sort",
        "hybrid and BM25 with two decay boosts, a sort by date or three pins, against the plain search",
        _boosts,
    ),
    Case(
        "Steer the ranking",
        "Typo tolerance",
        "the test queries clean and with one typo in their rarest word, BM25 and hybrid, typo tolerance off and auto",
        _typos,
    ),
]
