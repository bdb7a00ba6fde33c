"""Which chunking and passage aggregation to make the default: every combination scored offline, exactly (brute force
over all passages), on train queries (to choose) and test queries (to report), on the long-document variant
(bench.longdocs) and on the original dataset.

    python -m bench.chunking_study [--data ../shared/data/beir/scifact] [--model runs/bench/indexes/scifact/model]
                                   [--out runs/longdocs]

Legs: dense by one truncated vector per document (what an unchunked index does) or by passages (each chunking below,
aggregated by max or soft); BM25 on the whole document or on passages (max); hybrid of a BM25 and a dense leg with
the library's default fusion (over the top 100 of each). Passage vectors are cached in --out.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench.longdocs import make_long_variant
from hybrid_retrieval.indexer.chunking import Chunker, ChunkingParams, Span
from hybrid_retrieval.indexer.corpus import indexed_text, read_corpus, split_queries
from hybrid_retrieval.models.embedder import OnnxEmbedder
from hybrid_retrieval.quality.metrics import per_query_scores
from hybrid_retrieval.quality.significance import randomization_test
from hybrid_retrieval.search.analyzer import Analyzer
from hybrid_retrieval.search.bm25 import BM25Index, BM25Params
from hybrid_retrieval.search.fusion import DEFAULT_FUSION, Candidates, fuse
from hybrid_retrieval.search.passages import aggregate
from hybrid_retrieval.search.ranking import top_k
from hybrid_retrieval.search.spec import DEFAULT_DEPTH, PassageSpec

CHUNKINGS = {
    "truncated": ChunkingParams(),
    "tokens-128/16": ChunkingParams("tokens", 128, 16),
    "tokens-254/32": ChunkingParams("tokens", 254, 32),
    "paragraphs-254": ChunkingParams("paragraphs", 254, 32),
}
# an abstract is one paragraph and mostly fits 254 pieces: on the original corpus those two equal `truncated` nearly
SHORT_DOCUMENT_CHUNKINGS = ("truncated", "tokens-128/16")
SCORINGS = {
    "max": PassageSpec("max"),
    **{f"soft-t{t}": PassageSpec("soft", temperature=t, top=3) for t in (0.02, 0.05, 0.1)},
}
METRICS = ("ndcg@10", "recall@100")
RUN_DEPTH = 100


@dataclass
class Passages:
    rows: np.ndarray  # the document of each passage
    vectors: np.ndarray
    tokens: list[list[str]]
    embed_s: float


def passages_of(docs, chunker: Chunker, embedder, analyzer: Analyzer, cache: Path) -> Passages:
    spans: list[tuple[int, Span]] = [(row, span) for row, doc in enumerate(docs) for span in chunker.spans(doc.text)]
    texts = [indexed_text(docs[row].title, docs[row].text[span.start : span.end]) for row, span in spans]
    rows = np.array([row for row, _ in spans], dtype=np.int64)
    meta = cache.with_suffix(".json")
    if cache.is_file() and meta.is_file() and json.loads(meta.read_text())["passages"] == len(texts):
        vectors, embed_s = np.load(cache), json.loads(meta.read_text())["embed_s"]
    else:
        started = time.perf_counter()
        vectors = embedder.encode(texts, batch_size=32)
        embed_s = time.perf_counter() - started
        np.save(cache, vectors)
        meta.write_text(json.dumps({"passages": len(texts), "embed_s": embed_s}))
    return Passages(rows, vectors, [analyzer.analyze(t) for t in texts], embed_s)


def document_scores(passage_scores: np.ndarray, rows: np.ndarray, n: int, scoring: PassageSpec) -> np.ndarray:
    docs, scores = aggregate(passage_scores, rows, scoring)
    out = np.full(n, -np.inf, dtype=np.float32)
    out[docs] = scores
    return out


def study(dataset: Path, model: Path, cache: Path, chunkings: tuple[str, ...], precision: str) -> dict:
    docs = list(read_corpus(dataset))
    ids = [d.doc_id for d in docs]
    analyzer, embedder = Analyzer(), OnnxEmbedder(model, device="cpu", precision=precision)
    splits = {split: split_queries(dataset, split) for split in ("train", "test")}
    cache.mkdir(parents=True, exist_ok=True)
    passages = {
        name: passages_of(docs, Chunker(model, CHUNKINGS[name]), embedder, analyzer, cache / f"{name.replace('/', '-')}.npy")
        for name in chunkings
    }
    bm25 = {
        name: BM25Index.build(p.tokens, analyzer, BM25Params())
        for name, p in passages.items()
        if name == "truncated" or name.startswith("tokens-128")
    }
    sizes = {
        name: {"passages": len(p.rows), "vector_mib": round(p.vectors.nbytes / 2**20, 1), "embed_s": round(p.embed_s, 1)}
        for name, p in passages.items()
    }
    out: dict = {"dataset": str(dataset), "documents": len(docs), "precision": precision, "chunkings": sizes, "splits": {}}
    for split, (queries, qrels) in splits.items():
        qids = list(queries)
        qvectors = embedder.encode([queries[q] for q in qids], batch_size=32)
        legs: dict[str, dict[str, np.ndarray]] = {}  # leg name -> qid -> scores of every document
        for name, p in passages.items():
            sims = p.vectors @ qvectors.T  # (passages, queries)
            for scoring_name, scoring in SCORINGS.items():
                if name == "truncated" and scoring_name != "max":
                    continue
                label = "dense truncated" if name == "truncated" else f"dense {name} {scoring_name}"
                legs[label] = {q: document_scores(sims[:, i], p.rows, len(docs), scoring) for i, q in enumerate(qids)}
        for name, index in bm25.items():
            label = "bm25 whole" if name == "truncated" else f"bm25 {name} max"
            rows = passages[name].rows
            legs[label] = {q: document_scores(index.scores(queries[q]), rows, len(docs), SCORINGS["max"]) for q in qids}
        runs = {label: {q: _run(scores[q], ids, label.startswith("bm25")) for q in qids} for label, scores in legs.items()}
        for b in (name for name in legs if name.startswith("bm25")):
            for d in (name for name in legs if name.startswith("dense")):
                runs[f"hybrid {b} + {d}"] = {q: _hybrid(legs[b][q], legs[d][q], ids) for q in qids}
        per_query = {label: per_query_scores(run, qrels, METRICS) for label, run in runs.items()}
        table = {}
        for label, metrics in per_query.items():
            baseline = _baseline(label)
            row = {m: round(float(np.mean(list(metrics[m].values()))), 4) for m in METRICS}
            if baseline != label:
                a, b = (np.array([per_query[x]["ndcg@10"][q] for q in qids]) for x in (label, baseline))
                row["p_vs_" + baseline] = round(randomization_test(a, b), 4)
            table[label] = row
        out["splits"][split] = {"queries": len(qids), "results": table}
    return out


def _run(scores: np.ndarray, ids: list[str], lexical: bool) -> dict[str, float]:
    ranking = BM25Index.ranking_from_scores(scores, RUN_DEPTH) if lexical else top_k(np.nan_to_num(scores, neginf=-1e9), RUN_DEPTH)
    return {ids[i]: float(s) for i, s in zip(ranking.doc_idx, ranking.scores)}


def _hybrid(bm25: np.ndarray, dense: np.ndarray, ids: list[str]) -> dict[str, float]:
    rankings = {
        "bm25": BM25Index.ranking_from_scores(bm25, DEFAULT_DEPTH),
        "dense": top_k(np.nan_to_num(dense, neginf=-1e9), DEFAULT_DEPTH),
    }
    candidates = Candidates.from_rankings(rankings, {"bm25": lambda i: bm25[i], "dense": lambda i: dense[i]})
    fused = fuse(candidates, DEFAULT_FUSION).ranking().head(RUN_DEPTH)
    return {ids[i]: float(s) for i, s in zip(fused.doc_idx, fused.scores)}


def _baseline(label: str) -> str:
    if label.startswith("hybrid"):
        return "hybrid bm25 whole + dense truncated"
    return "dense truncated" if label.startswith("dense") else "bm25 whole"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.chunking_study", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, default=Path("../shared/data/beir/scifact"))
    parser.add_argument("--model", type=Path, default=Path("runs/bench/indexes/scifact/model"))
    parser.add_argument("--out", type=Path, default=Path("runs/longdocs"))
    parser.add_argument("--group", type=int, default=5, help="original documents per long document")
    parser.add_argument(
        "--precision", default="int8", help="the ONNX weights that embed passages and queries (int8 is the faster on a CPU)"
    )
    args = parser.parse_args(argv)
    variant = make_long_variant(args.data, args.out / f"{args.data.name}-long{args.group}", args.group)
    report = {}
    for name, dataset, chunkings in ((variant.name, variant, tuple(CHUNKINGS)), (args.data.name, args.data, SHORT_DOCUMENT_CHUNKINGS)):
        report[name] = study(dataset, args.model, args.out / "cache" / f"{name}-{args.precision}", chunkings, args.precision)
        print(json.dumps(report[name], indent=1))
    (args.out / "chunking-study.json").write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
