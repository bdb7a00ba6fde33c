"""The product's rankings side by side with the peers' defaults, on the same vectors: LanceDB and Pyserini run in
their own environment (bench/peers/setup.sh; the case skips without it) on the documents, the document vectors and
the query vectors the product's untuned index serves with, so the fusion and the lexical leg are what differ.

Every row is scored on the test split against the product's default (no labels) with the paired randomisation test.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np

from bench.harness import Case, Table
from hybrid_retrieval.indexer.corpus import read_corpus, split_queries
from hybrid_retrieval.indexer.store import EMBEDDINGS, open_index
from hybrid_retrieval.quality.metrics import per_query_scores
from hybrid_retrieval.quality.significance import randomization_test

DEPTH = 100  # each leg's candidates, and the ranking's length (Recall@100)
RUNNER = Path(__file__).parent / "peers" / "run_peers.py"
DEFAULT = "this project, default (no labels)"


def peers_python(work: Path) -> Path:
    """The peers' interpreter: HYBRID_PEERS_PYTHON, or the environment bench/peers/setup.sh makes in the work folder."""
    return Path(os.environ.get("HYBRID_PEERS_PYTHON") or work / "peers-venv" / "bin" / "python")


def _ours(
    index_dir: Path, queries: dict[str, str], requests: dict[str, dict], vectors: np.ndarray | None = None
) -> tuple[dict[str, dict], np.ndarray]:
    """Each named request's run over the queries (as served: the index's defaults under the request), and the
    query vectors the index embedded them with (`vectors` when given: another index of the same model's)."""
    index = open_index(index_dir, verify="size")
    try:
        pipeline = index.pipeline()
        if vectors is None:
            vectors = np.vstack([pipeline.embedder.encode([text])[0] for text in queries.values()]).astype(np.float32)
        runs: dict[str, dict] = {}
        for name, request in requests.items():
            spec = pipeline.resolve(request)
            run = {}
            for (qid, text), vector in zip(queries.items(), vectors):
                ranking = pipeline.search(text, k=DEPTH, spec=spec, vector=vector).ranking
                run[qid] = {index.doc_ids[i]: float(s) for i, s in zip(ranking.doc_idx, ranking.scores)}
            runs[name] = run
        return runs, vectors
    finally:
        index.close()


def _export(folder: Path, data: Path, queries: dict[str, str], index_dir: Path, query_vectors: np.ndarray) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "docs.jsonl").open("w") as out:
        for doc in read_corpus(data):
            out.write(json.dumps({"id": doc.doc_id, "title": doc.title, "text": doc.text}) + "\n")
    (folder / "queries.json").write_text(json.dumps(queries))
    shutil.copyfile(index_dir / EMBEDDINGS, folder / "doc_vectors.npy")  # the product's document vectors
    np.save(folder / "query_vectors.npy", query_vectors)


def _table(runs: dict[str, dict], qrels: dict) -> list[dict]:
    measures = ("ndcg@10", "recall@100")
    qids = sorted(qrels)
    scores = {
        name: {m: np.array([values[q] for q in qids]) for m, values in per_query_scores(run, qrels, measures).items()}
        for name, run in runs.items()
    }
    ours = scores[DEFAULT]
    rows = []
    for name, values in scores.items():
        row: dict = {"system": name}
        for measure, label in zip(measures, ("nDCG@10", "Recall@100")):
            row[label] = round(float(values[measure].mean()), 4)
            row[f"default minus it, {label}"] = round(float(ours[measure].mean() - values[measure].mean()), 4)
            row[f"p, {label}"] = None if name == DEFAULT else round(randomization_test(ours[measure], values[measure]), 4)
        rows.append(row)
    return rows


def _peers(ctx) -> list[Table]:
    queries, qrels = split_queries(ctx.data, "test")
    if ctx.quick:
        queries = dict(list(queries.items())[:20])
        qrels = {q: qrels[q] for q in queries}
    untuned, tuned = ctx.untuned_index, ctx.tuned_copy(ctx.untuned_index)
    runs, vectors = _ours(
        untuned,
        queries,
        {
            DEFAULT: {},
            "this project, RRF (rrf_k 60)": {"fusion": {"method": "rrf", "rrf_k": 60}},
            "this project, BM25": {"mode": "bm25"},
            "this project, dense": {"mode": "dense"},
        },
    )
    tuned_runs, _ = _ours(tuned, queries, {"this project, fusion tuned on train (`hybrid tune`)": {}}, vectors)
    folder = ctx.work / "peers"
    _export(folder, ctx.data, queries, untuned, vectors)
    done = subprocess.run([str(peers_python(ctx.work)), str(RUNNER), str(folder), str(DEPTH)], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"the peers' run failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    peers = json.loads((folder / "peer_runs.json").read_text())
    rows = _table({**runs, **tuned_runs, **peers["runs"]}, qrels)
    versions = ", ".join(f"{name} {v}" for name, v in peers["versions"].items())
    failed = {name: n for name, n in peers["settings"]["lancedb_failed_queries"].items() if n}
    return [
        Table(
            f"side by side on the same vectors ({len(qrels)} test queries)",
            rows,
            f"Every system ranks the top {DEPTH} with the product's document and query vectors (all-MiniLM-L6-v2, the "
            "queries embedded as served); the lexical legs are each system's own. p: paired randomisation test of "
            f"the per-query metric against the product's default (10,000 permutations). Peers: {versions}, each with its "
            "documented defaults (Pyserini's fusion functions over its BM25 run and the same dense run; LanceDB's "
            f"native full-text index and hybrid query with limit {DEPTH})."
            + (f" Queries LanceDB's full-text parser refused (no results): {failed}." if failed else ""),
        )
    ]


CASES = [
    Case(
        "Quality",
        "Peers",
        "the product's untuned and tuned defaults against LanceDB's and Pyserini's defaults on the same vectors, test split",
        _peers,
        needs=("peers",),
    )
]
