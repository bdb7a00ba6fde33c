"""A long-document variant of a BEIR dataset, to measure chunking where it matters, and the benchmark case that
compares a chunked index with one vector per document on it and on the original dataset.

Each long document is `group` consecutive documents of the original corpus (in its file order), each part written as
its title and text, parts separated by a blank line; the long document has no title of its own. A query is relevant to
a long document when it was relevant to one of its parts (the highest grade among them). Queries are unchanged. With
scifact's abstracts (about 300 word pieces each) and group 5, a long document is about 1,500 word pieces, six times
what all-MiniLM-L6-v2 reads.

    python -m bench.longdocs OUT [--data ../shared/data/beir/scifact] [--group 5]
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from bench.harness import Case, Table, percentiles, timed_ms
from hybrid_retrieval.indexer.corpus import read_corpus, read_qrels, split_queries
from hybrid_retrieval.indexer.leftovers import folder_bytes
from hybrid_retrieval.indexer.manifest import read_manifest
from hybrid_retrieval.indexer.store import open_index

PART_SEPARATOR = "\n\n"
GROUP = 5
CHUNKING = "tokens:128:16"  # what bench.chunking_study chose on train queries (docs/experiments.md)
PIPELINES = ("bm25", "dense", "hybrid")
METRICS = ("ndcg@10", "recall@100")
LATENCY_QUERIES = 100


def make_long_variant(source: Path, out: Path, group: int = 5) -> Path:
    """Write the variant of the BEIR folder `source` into `out` (BEIR layout) and return `out`; kept when present and
    made with the same group size."""
    description = {"source": str(source), "group": group, "separator": PART_SEPARATOR}
    if (out / "variant.json").is_file() and json.loads((out / "variant.json").read_text()) == description:
        return out
    out.mkdir(parents=True, exist_ok=True)
    parent_of: dict[str, str] = {}
    docs = list(read_corpus(source))
    with (out / "corpus.jsonl").open("w", encoding="utf-8") as fh:
        for first in range(0, len(docs), group):
            parts = docs[first : first + group]
            doc_id = f"long-{first // group}"
            text = PART_SEPARATOR.join(f"{d.title}. {d.text}" if d.title else d.text for d in parts)
            fh.write(json.dumps({"_id": doc_id, "title": "", "text": text, "parts": [d.doc_id for d in parts]}, ensure_ascii=False) + "\n")
            parent_of.update({d.doc_id: doc_id for d in parts})
    shutil.copyfile(source / "queries.jsonl", out / "queries.jsonl")
    (out / "qrels").mkdir(exist_ok=True)
    for qrels_file in sorted((source / "qrels").glob("*.tsv")):
        mapped: dict[tuple[str, str], int] = {}
        for qid, judged in read_qrels(qrels_file).items():
            for doc_id, grade in judged.items():
                key = (qid, parent_of[doc_id])
                mapped[key] = max(grade, mapped.get(key, grade))
        lines = ["query-id\tcorpus-id\tscore", *(f"{q}\t{d}\t{g}" for (q, d), g in mapped.items())]
        (out / "qrels" / qrels_file.name).write_text("\n".join(lines) + "\n")
    (out / "variant.json").write_text(json.dumps(description, indent=2) + "\n")
    return out


def _index(ctx, dataset: Path, folder: Path, *flags: str) -> Path:
    """`dataset` indexed afresh into `folder` (its tuned copy dropped): the build times it reports are this run's."""
    for stale in (folder, folder.with_name(folder.name + "-tuned")):
        shutil.rmtree(stale, ignore_errors=True)
    ctx.hybrid("index", dataset, "--out", folder, "--quiet", *flags)
    return folder


def _compare(ctx, dataset: Path, chunked: Path, truncated: Path, out: Path) -> dict:
    ctx.hybrid(
        "eval", "--data", dataset, "--index", chunked, "--baseline-index", truncated, "--no-tune", "--quiet",
        "--pipelines", ",".join(PIPELINES), "--out", out,
    )  # fmt: skip
    return json.loads((out / dataset.name / "report.json").read_text())


def _quality_rows(dataset: Path, defaults: str, report: dict) -> list[dict]:
    rows = []
    for pipeline in PIPELINES:
        row, base = report["pipelines"][pipeline], report["baseline_index"]["pipelines"][pipeline]
        rows.append(
            {
                "dataset": f"{dataset.name} test ({report['queries']} queries)",
                "defaults": defaults,
                "pipeline": pipeline,
                **{f"{m} one vector": base["baseline"][m] for m in METRICS},
                **{f"{m} chunked": row[m] for m in METRICS},
                "nDCG@10 change": base["ndcg@10_delta"],
                "p": base["p_value"],
                "wins/ties/losses": f"{base['wins']}/{base['ties']}/{base['losses']}",
            }
        )
    return rows


def _latency(index: Path, queries: list[str], mode: str) -> float:
    opened = open_index(index, verify="size")
    try:
        pipeline = opened.pipeline()
        pipeline.search(queries[0], 10, {"mode": mode})  # warm
        return percentiles([timed_ms(lambda q=q: pipeline.search(q, 10, {"mode": mode})) for q in queries])["p50_ms"]
    finally:
        opened.close()


def _long_documents(ctx) -> list[Table]:
    root = ctx.work / "longdocs"
    variant = make_long_variant(ctx.data, root / f"{ctx.data.name}-long{GROUP}", GROUP)
    quality, cost = [], []
    for dataset in (variant, ctx.data):
        truncated = _index(ctx, dataset, root / f"{dataset.name}-truncated")
        chunked = _index(ctx, dataset, root / f"{dataset.name}-chunked", "--chunking", CHUNKING)
        pairs = {
            "untuned (the default fusion)": (chunked, truncated),
            "both tuned on train": (ctx.tuned_copy(chunked, dataset), ctx.tuned_copy(truncated, dataset)),
        }
        for defaults, (mine, theirs) in pairs.items():
            report = _compare(ctx, dataset, mine, theirs, root / "eval" / dataset.name / defaults.split()[0])
            quality += _quality_rows(dataset, defaults, report)
        queries = list(split_queries(dataset, "test")[0].values())[: ctx.size(LATENCY_QUERIES, 5)]
        for label, index in (("one vector", truncated), (f"chunked {CHUNKING}", chunked)):
            manifest = read_manifest(index)
            cost.append(
                {
                    "dataset": dataset.name,
                    "index": label,
                    "documents": manifest.documents,
                    "passages": manifest.counts.get("passages", manifest.documents),
                    "disk MiB": round(folder_bytes(index) / 2**20, 1),
                    "build s": manifest.build.get("total_s"),
                    "dense p50 ms": _latency(index, queries, "dense"),
                    "hybrid p50 ms": _latency(index, queries, "hybrid"),
                }
            )
    return [
        Table(
            f"chunked ({CHUNKING}) against one vector per document, untuned and both tuned on train, test split",
            quality,
            f"The long-document variant joins {GROUP} consecutive abstracts into one document (bench/longdocs.py); a "
            "query is relevant to it when it was to one of its parts. p: paired randomisation test on nDCG@10.",
        ),
        Table("what chunking costs: passages, disk, build time and in-process search latency (k=10)", cost),
    ]


CASES = [
    Case(
        "Quality",
        "Long documents",
        f"an index chunked into passages ({CHUNKING}) against one vector per document, on {GROUP}-abstract documents and on "
        "the original abstracts",
        _long_documents,
    )
]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.longdocs", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("out", type=Path)
    parser.add_argument("--data", type=Path, default=Path("../shared/data/beir/scifact"))
    parser.add_argument("--group", type=int, default=5, help="original documents per long document")
    args = parser.parse_args(argv)
    print(make_long_variant(args.data, args.out, args.group))


if __name__ == "__main__":
    main()
