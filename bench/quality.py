"""Ranking quality on the dataset's test split: the service as served (the README's headline), every pipeline through
`hybrid eval` with significance against BM25, and published reference numbers."""

from __future__ import annotations

import json

from bench.harness import Case, Table, percentiles
from hybrid_retrieval.evaluation.served import served_quality

# Published scifact test-split numbers (the dataset's README lists their sources).
REFERENCES = [
    {"system": "BM25, bm25s Lucene k1=1.5 b=0.75, Snowball + English stopwords", "nDCG@10": 0.687, "Recall@100": None},
    {"system": "BM25, Elasticsearch multifield (BEIR paper)", "nDCG@10": 0.665, "Recall@100": 0.908},
    {"system": "BM25, Pyserini flat (k1=0.9, b=0.4)", "nDCG@10": 0.679, "Recall@100": 0.925},
    {"system": "dense, all-MiniLM-L6-v2 (MTEB)", "nDCG@10": 0.645, "Recall@100": None},
]
# What `hybrid eval` runs: the legs, the tuned hybrid, the reranker alone (w=1) and interpolated, int8 weights.
PIPELINES = "bm25,dense,hybrid,bm25+rerank:w=1,bm25+rerank,hybrid+rerank:w=1,hybrid+rerank,hybrid+rerank@int8"


def _headline(ctx) -> list[Table]:
    rows = []
    served = [
        ("BM25", {"mode": "bm25"}, {}),
        ("dense", {"mode": "dense"}, {}),
        ("hybrid (the default)", {}, {}),
        ("hybrid + trained reranker", {}, {"HYBRID_RERANKER": str(ctx.reranker)}),
    ]
    for name, request, env in served:
        result = served_quality(ctx.index, ctx.data, "test", env, request=request)
        rows.append(
            {
                "search": name,
                "dataset": f"{ctx.data.name} test ({result['queries']} queries)",
                "nDCG@10": result["ndcg@10"],
                "Recall@100": result["recall@100"],
                "p50 ms": percentiles(result["latencies_ms"])["p50_ms"],
            }
        )
    return [
        Table(
            "as served over HTTP",
            rows,
            "POST /search with the query (and the mode) alone, k=100, one client; the "
            "latency is the round trip on loopback, the model on the CPU cores of the machine its run names.",
        )
    ]


def _pipelines(ctx) -> list[Table]:
    out = ctx.work / "eval"
    ctx.hybrid(
        "eval",
        "--data",
        ctx.data,
        "--split",
        "test",
        "--index",
        ctx.index,
        "--all-fusions",
        "--all-hubness",
        "--reranker",
        ctx.reranker,
        "--pipelines",
        PIPELINES,
        "--out",
        out,
        "--quiet",
    )
    report = json.loads((out / ctx.data.name / "report.json").read_text())
    baseline = report["baseline"]
    rows = [
        {
            "pipeline": name,
            "nDCG@10": m["ndcg@10"],
            "Recall@100": m["recall@100"],
            "MRR@10": m["mrr@10"],
            "MAP@100": m["map@100"],
            "N10 skewness": m["n10_skewness"],
            f"wins/ties/losses vs {baseline}": f"{m['wins']}/{m['ties']}/{m['losses']}",
            "p": m["p_value_vs_baseline"],
        }
        for name, m in report["pipelines"].items()
    ]
    tables = [
        Table(
            f"every pipeline ({report['queries']} queries)",
            rows,
            f"p: paired two-sided randomisation test of per-query nDCG@10 against {baseline} (10,000 permutations). "
            "`+qbnorm` / `+dbnorm`: hubness corrections (`:dis` the dynamic variants); `+rerank:w=1` the "
            "cross-encoder's order alone, `+rerank` interpolated at the tuned weight, `@int8` int8 weights.",
        )
    ]
    reranked = [
        {
            "pipeline": name,
            "first stage": v["first_stage"],
            "nDCG@10 change": v["ndcg@10_delta"],
            "wins/ties/losses": f"{v['wins']}/{v['ties']}/{v['losses']}",
            "p": v["p_value"],
        }
        for name, r in report["pipelines"].items()
        if (v := r.get("vs_first_stage"))
    ]
    if reranked:
        tables.append(Table("reranking against its own first stage", reranked))
    return tables


CASES = [
    Case(
        "Quality",
        "Headline",
        "the service as served: `hybrid serve` over the index built, tuned and fitted on the "
        "train split, every test query sent to POST /search",
        _headline,
        headline=True,
    ),
    Case("Quality", "Pipelines", "`hybrid eval` on the test split, the fusion tuned and hubness fitted on train", _pipelines),
    Case(
        "Quality",
        "Published references",
        "numbers published for the same split (not measured here)",
        lambda ctx: [Table("published", REFERENCES)],
    ),
]
