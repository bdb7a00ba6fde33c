"""Hubness diagnostics: k-occurrence skewness, never-retrieved share and top hubs, before and after
each correction (`hybrid hubness report`)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from hybrid_retrieval.common.errors import ConfigError
from hybrid_retrieval.indexer.corpus import read_qrels, read_queries
from hybrid_retrieval.indexer.store import open_index
from hybrid_retrieval.search.hubness import HubnessCorrection, hubness_stats, k_occurrence
from hybrid_retrieval.training.hubness import corrected_rankings

VARIANTS = (("none", False), ("qbnorm", False), ("qbnorm", True), ("dbnorm", False), ("dbnorm", True))


def hubness_report(queries: np.ndarray, embeddings: np.ndarray, correction: HubnessCorrection, doc_ids: list[str], k: int = 10) -> dict:
    """N_k skewness, never-retrieved share and top hubs of the dense top-k, for every variant."""
    report = {}
    for method, dynamic in VARIANTS:
        counts = k_occurrence(corrected_rankings(queries, embeddings, correction, method, dynamic, k), len(embeddings), k)
        hubs = np.argsort(-counts, kind="stable")[:5]
        name = method if method == "none" else f"{method} {'DIS' if dynamic else 'IS'}"
        report[name] = {**hubness_stats(counts), "top_hubs": [(doc_ids[h], int(counts[h])) for h in hubs], "counts": counts}
    return report


def plot_histograms(report: dict, path: Path, k: int = 10) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    top = max(int(v["counts"].max()) for v in report.values())
    bins = list(range(top + 2))  # one bin per count
    for name, values in report.items():
        ax.hist(values["counts"], bins=bins, histtype="step", label=f"{name} (skew {values['skewness']:.2f})", log=True)
    ax.set_xlabel(f"N_{k}: number of queries whose top-{k} holds the document")
    ax.set_ylabel("documents (log scale)")
    ax.set_title("k-occurrence distribution, dense retrieval")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_report(
    index_dir: Path, queries_path: Path, split_qrels: Path | None = None, k: int = 10, out: Path | None = None
) -> tuple[int, Path, dict, dict]:
    """Report every variant for the queries (of one split), write report.json and the histogram into
    `out` (default INDEX/hubness_report); returns (queries, out, rows, the index's default correction and
    the evidence it rests on)."""
    index = open_index(index_dir, verify="size", device="cpu")
    try:
        if index.hubness is None:
            raise ConfigError("this index has no fitted hubness correction: run `hybrid hubness fit` first")
        queries = read_queries(queries_path)
        if split_qrels:
            queries = {q: queries[q] for q in read_qrels(split_qrels) if q in queries}
        report = hubness_report(
            index.query_embedder.encode(list(queries.values())), np.asarray(index.embeddings), index.hubness.correction, index.doc_ids, k=k
        )
        default = {"hubness": index.manifest.defaults.to_dict()["hubness"], "evidence": index.manifest.evidence.get("hubness")}
    finally:
        index.close()
    out = out or Path(index_dir) / "hubness_report"
    out.mkdir(parents=True, exist_ok=True)
    plot_histograms(report, out / "k_occurrence.png", k)
    rows = {name: {key: v for key, v in values.items() if key != "counts"} for name, values in report.items()}
    (out / "report.json").write_text(json.dumps({"queries": len(queries), "k": k, "variants": rows, "default": default}, indent=2))
    return len(queries), out, rows, default
