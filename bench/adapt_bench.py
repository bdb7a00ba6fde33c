"""The "Encoder adaptation" section of docs/BENCHMARKS.md, from what the commands left behind: each adapted model's
training.json (`hybrid train-embedder`, `hybrid adapt`) and the `hybrid eval --baseline-index` report of the index
re-embedded with it (`hybrid reembed`), plus reports of indexes whose fusion `hybrid tune --pseudo` chose.

    python -m bench.adapt_bench --model supervised=MODEL_DIR:REPORT_JSON [--model ...] \\
        [--pseudo-tuned LABEL=REPORT_JSON ...] [--note TEXT ...] [--markdown-file docs/BENCHMARKS.md]

scripts/benchmarks.sh runs the commands and then this.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from hybrid_retrieval.evaluation.report import write_section
from hybrid_retrieval.search.fusion import fusion_from_dict, fusion_to_string

SECTION = "## Encoder adaptation (`hybrid train-embedder`, `hybrid adapt`, `hybrid reembed`)"
METRIC = "ndcg@10"


def _pair(text: str) -> tuple[str, str]:
    label, sep, value = text.partition("=")
    if not sep or not label or not value:
        raise argparse.ArgumentTypeError(f"expected LABEL=VALUE, got {text!r}")
    return label, value


def _training_row(label: str, record: dict) -> str:
    data, held_out, options = record["data"], record["held_out"], record["options"]
    epochs = len(held_out["per_epoch"]) - 1
    curve = " -> ".join(f"{row[METRIC]:.4f}" for row in held_out["per_epoch"])
    pseudo = data.get("pseudo")
    examples = f"{data['examples_per_epoch']}" + (f" (of {sum(pseudo['generated'].values())} generated)" if pseudo else "")
    return (f"| {label} | {data['recipe']} | {examples} | {data['held_out_queries']} ({data['held_out_pool']} pooled docs) | "
            f"{epochs} of {options['epochs']}, best {held_out['best_epoch']} | {curve} | {record['seconds']['total'] / 60:.1f} | "
            f"{record['peak_rss_mib'] / 1024:.1f} | {record['device']} |")


def _test_rows(label: str, report: dict) -> list[str]:
    rows = []
    for pipeline, row in report["baseline_index"]["pipelines"].items():
        before = row["baseline"][METRIC]
        rows.append(f"| {label} | {pipeline} | {before:.4f} | {before + row[f'{METRIC}_delta']:.4f} | {row[f'{METRIC}_delta']:+.4f} | "
                    f"{row['p_value']:.4f} | {row['wins']}/{row['ties']}/{row['losses']} |")
    return rows


def markdown(models: list[tuple[str, dict, dict]], pseudo_tuned: list[tuple[str, dict]], notes: list[str] = ()) -> str:
    """`models`: (label, training record, eval report with baseline_index); `pseudo_tuned`: (label, eval report);
    `notes`: how this run was made, one paragraph each."""
    lines = [SECTION, "", "Training (held-out nDCG@10: dense retrieval of the held-out queries over their pooled hybrid top-N; "
             "epoch 0 is the base model):", "",
             "| model | recipe | examples per epoch | held-out queries | epochs run | held-out nDCG@10 by epoch | minutes | peak GiB | device |",
             "|---|---|---:|---:|---|---|---:|---:|---|"]
    lines += [_training_row(label, record) for label, record, _ in models]
    split = models[0][2] if models else (pseudo_tuned[0][1] if pseudo_tuned else None)
    if split:
        lines += ["", f"{split['dataset']} {split['split']} ({split['queries']} queries, never used for any choice): each pipeline "
                  "on the base index and on the index re-embedded with the model, same fusion procedure (`hybrid reembed` re-tunes "
                  "a tuned fusion on the same split; an untuned index stays RRF), paired two-sided randomisation test:", "",
                  "| model | pipeline | base | adapted | change | p | wins/ties/losses |", "|---|---|---:|---:|---:|---:|---|"]
        for label, _, report in models:
            lines += _test_rows(label, report)
    if pseudo_tuned:
        lines += ["", "Label-free fusion (`hybrid tune --pseudo`) against the unlabelled default, RRF (rrf_k 60), on the same test "
                  "queries:", "", "| pseudo-queries | fusion chosen | RRF 60 | tuned | change | p | wins/ties/losses |",
                  "|---|---|---:|---:|---:|---:|---|"]
        for label, report in pseudo_tuned:
            row = report["baseline_index"]["pipelines"]["hybrid"]
            before = row["baseline"][METRIC]
            fusion = fusion_to_string(fusion_from_dict(report["defaults"]["fusion"]))
            lines.append(f"| {label} | {fusion} | {before:.4f} | {before + row[f'{METRIC}_delta']:.4f} | {row[f'{METRIC}_delta']:+.4f} | "
                         f"{row['p_value']:.4f} | {row['wins']}/{row['ties']}/{row['losses']} |")
    for note in notes:
        lines += ["", note]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=_pair, action="append", default=[], help="LABEL=MODEL_DIR:REPORT_JSON")
    parser.add_argument("--pseudo-tuned", type=_pair, action="append", default=[], help="LABEL=REPORT_JSON")
    parser.add_argument("--note", action="append", default=[], help="a paragraph on how this run was made (repeatable)")
    parser.add_argument("--markdown-file", type=Path, default=Path("docs/BENCHMARKS.md"))
    args = parser.parse_args(argv)
    models = []
    for label, value in args.model:
        folder, _, report = value.rpartition(":")
        models.append((label, json.loads((Path(folder) / "training.json").read_text()), json.loads(Path(report).read_text())))
    pseudo = [(label, json.loads(Path(report).read_text())) for label, report in args.pseudo_tuned]
    section = markdown(models, pseudo, args.note)
    write_section(args.markdown_file, section)
    print(section)


if __name__ == "__main__":
    main()
