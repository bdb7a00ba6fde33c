"""Encoder adaptation: the encoder fine-tuned on the train split (`hybrid train-embedder`) and encoders adapted on
label-free pseudo-queries (`hybrid adapt`), each index re-embedded with it (`hybrid reembed`) and compared with its
base by `hybrid eval --baseline-index`; and the fusion chosen on pseudo-queries (`hybrid tune --pseudo`) against the untuned default."""

from __future__ import annotations

import json
from pathlib import Path

from bench.context import ADAPT_RECIPES
from bench.harness import Case, Table
from hybrid_retrieval.search.fusion import fusion_from_dict, fusion_to_string

METRIC = "ndcg@10"


def _compared(ctx, index: Path, baseline: Path, out: str, pipelines: str, *flags) -> dict:
    """`hybrid eval` of `index` against the same pipelines on `baseline` (paired randomisation test)."""
    folder = ctx.work / "adapt" / out
    ctx.hybrid(
        "eval",
        "--data",
        ctx.data,
        "--index",
        index,
        "--baseline-index",
        baseline,
        "--no-tune",
        "--quiet",
        "--pipelines",
        pipelines,
        "--out",
        folder,
        *flags,
    )
    return json.loads((folder / ctx.data.name / "report.json").read_text())


def training_row(label: str, record: dict) -> dict:
    data, held_out, options = record["data"], record["held_out"], record["options"]
    pseudo = data.get("pseudo")
    return {
        "model": label,
        "recipe": data["recipe"],
        "examples per epoch": data["examples_per_epoch"],
        "generated": sum(pseudo["generated"].values()) if pseudo else None,
        "held-out queries": data["held_out_queries"],
        "epochs run": len(held_out["per_epoch"]) - 1,
        "epochs asked": options["epochs"],
        "best epoch": held_out["best_epoch"],
        "held-out nDCG@10 by epoch": " -> ".join(f"{row[METRIC]:.4f}" for row in held_out["per_epoch"]),
        "training s": record["seconds"]["total"],
        "peak RSS MiB": record["peak_rss_mib"],
        "device": record["device"],
    }


def comparison_rows(label: str, report: dict) -> list[dict]:
    rows = []
    for pipeline, row in report["baseline_index"]["pipelines"].items():
        before = row["baseline"][METRIC]
        rows.append(
            {
                "model": label,
                "pipeline": pipeline,
                "base": before,
                "adapted": round(before + row[f"{METRIC}_delta"], 4),
                "change": row[f"{METRIC}_delta"],
                "p": row["p_value"],
                "wins/ties/losses": f"{row['wins']}/{row['ties']}/{row['losses']}",
            }
        )
    return rows


def _adaptation(ctx) -> list[Table]:
    supervised = ctx.copy_of(ctx.index, ctx.data.name + "-adapted")
    ctx.hybrid("reembed", supervised, "--model", ctx.embedder, "--quiet")
    models = [
        (
            "supervised",
            ctx.embedder,
            _compared(ctx, supervised, ctx.index, "supervised", "bm25,dense,hybrid,rrf:60,hybrid+rerank", "--reranker", ctx.reranker),
        )
    ]
    pseudo_tuned = []
    for recipe in ADAPT_RECIPES:
        adapted = ctx.copy_of(ctx.untuned_index, f"{ctx.data.name}-{recipe}")
        ctx.hybrid("reembed", adapted, "--model", ctx.adapted(recipe), "--quiet")
        models.append(
            (f"{recipe} pseudo-queries", ctx.adapted(recipe), _compared(ctx, adapted, ctx.untuned_index, recipe, "bm25,dense,hybrid"))
        )
        tuned = ctx.copy_of(ctx.untuned_index, f"{ctx.data.name}-pseudo-{recipe}")
        ctx.hybrid("tune", tuned, "--pseudo", recipe, "--max-queries", 1000, "--quiet")
        pseudo_tuned.append((recipe, _compared(ctx, tuned, ctx.untuned_index, f"pseudo-{recipe}", "hybrid")))
    training = [training_row(label, json.loads((folder / "training.json").read_text())) for label, folder, _ in models]
    test = [row for label, _, report in models for row in comparison_rows(label, report)]
    fusion = []
    for label, report in pseudo_tuned:
        row = report["baseline_index"]["pipelines"]["hybrid"]
        fusion.append(
            {
                "pseudo-queries": label,
                "fusion chosen": fusion_to_string(fusion_from_dict(report["defaults"]["fusion"])),
                "untuned default": row["baseline"][METRIC],
                "tuned": round(row["baseline"][METRIC] + row[f"{METRIC}_delta"], 4),
                "change": row[f"{METRIC}_delta"],
                "p": row["p_value"],
                "wins/ties/losses": f"{row['wins']}/{row['ties']}/{row['losses']}",
            }
        )
    return [
        Table(
            "training (held-out nDCG@10: dense retrieval of held-out queries over their pooled hybrid top-N; epoch 0 is the base model)",
            training,
        ),
        Table("test split, base index vs re-embedded (same fusion procedure; paired randomisation test)", test),
        Table("label-free fusion (`hybrid tune --pseudo`) against the untuned default on the test queries", fusion),
    ]


CASES = [
    Case(
        "Models",
        "Encoder adaptation",
        "encoders trained on the train split and on label-free pseudo-queries, "
        "each index re-embedded and compared with its base on the test split",
        _adaptation,
    )
]
