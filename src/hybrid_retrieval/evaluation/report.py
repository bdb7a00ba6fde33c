"""Evaluation artefacts: TREC run files, report.md with significance marks, and charts."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hybrid_retrieval.quality.significance import randomization_test

ALPHA = 0.05


def write_trec_run(run: dict[str, dict[str, float]], path: Path, tag: str) -> None:
    """`qid Q0 docid rank score tag`, ranks from 1 in descending score order."""
    with path.open("w") as fh:
        for qid, docs in run.items():
            for rank, (doc, score) in enumerate(sorted(docs.items(), key=lambda kv: -kv[1]), start=1):
                fh.write(f"{qid} Q0 {doc} {rank} {score:.6f} {tag}\n")


def compare_to_baseline(per_query: dict[str, dict[str, dict[str, float]]], baseline: str, metric: str = "ndcg@10") -> dict:
    """Per pipeline: p-value vs the baseline, and per-query wins / ties / losses on `metric`."""
    base = per_query[baseline][metric]
    qids = sorted(base)
    b = np.array([base[q] for q in qids])
    out = {}
    for name, metrics in per_query.items():
        a = np.array([metrics[metric][q] for q in qids])
        out[name] = {
            "p_value": 1.0 if name == baseline else randomization_test(a, b),
            "wins": int((a > b + 1e-9).sum()),
            "ties": int((np.abs(a - b) <= 1e-9).sum()),
            "losses": int((a < b - 1e-9).sum()),
        }
    return out


def markdown_table(report: dict, comparison: dict, baseline: str) -> str:
    metrics = [m for m in next(iter(report["pipelines"].values()))]
    lines = [
        f"# {report['dataset']} / {report['split']} ({report['queries']} queries)",
        "",
        "| pipeline | " + " | ".join(metrics) + f" | vs {baseline} (nDCG@10 wins/ties/losses) |",
        "|---|" + "---:|" * len(metrics) + "---|",
    ]
    for name, values in report["pipelines"].items():
        c = comparison[name]
        mark = "†" if c["p_value"] < ALPHA and name != baseline else ""
        lines.append(
            f"| {name}{mark} | "
            + " | ".join(f"{values[m]:.4f}" for m in metrics)
            + f" | {c['wins']}/{c['ties']}/{c['losses']} (p={c['p_value']:.3g}) |"
        )
    lines += ["", f"† nDCG@10 differs from {baseline} at p < {ALPHA} (paired two-sided randomisation test, 10,000 permutations)."]
    return "\n".join(lines) + "\n"


def first_stage_table(pipelines: dict) -> list[str]:
    """Markdown lines comparing each reranked pipeline with its own first stage (empty when there is none)."""
    rows = [(name, r["vs_first_stage"]) for name, r in pipelines.items() if "vs_first_stage" in r]
    if not rows:
        return []
    return [
        "",
        "Reranking against its own first stage (per-query nDCG@10, paired randomisation test):",
        "",
        "| pipeline | first stage | nDCG@10 change | wins/ties/losses | p |",
        "|---|---|---:|---|---:|",
        *(
            f"| {name} | {v['first_stage']} | {v['ndcg@10_delta']:+.4f} | {v['wins']}/{v['ties']}/{v['losses']} | {v['p_value']:.3g} |"
            for name, v in rows
        ),
    ]


def plot_charts(report: dict, comparison: dict, out: Path, baseline: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(report["pipelines"])
    fig, ax = plt.subplots(figsize=(max(6, 0.6 * len(names)), 4.5))
    values = [report["pipelines"][n]["ndcg@10"] for n in names]
    ax.bar(names, values, color=["tab:red" if comparison[n]["p_value"] < ALPHA and n != baseline else "tab:blue" for n in names])
    ax.set_ylim(min(values) - 0.05, max(values) + 0.02)
    ax.set_ylabel("nDCG@10")
    ax.set_title(f"{report['dataset']} {report['split']}: red = significantly different from {baseline}")
    ax.tick_params(axis="x", rotation=60)
    fig.tight_layout()
    fig.savefig(out / "ndcg.png", dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(max(6, 0.6 * len(names)), 4.5))
    wins = np.array([comparison[n]["wins"] for n in names])
    ties = np.array([comparison[n]["ties"] for n in names])
    losses = np.array([comparison[n]["losses"] for n in names])
    ax.bar(names, wins, label="wins", color="tab:green")
    ax.bar(names, ties, bottom=wins, label="ties", color="lightgrey")
    ax.bar(names, losses, bottom=wins + ties, label="losses", color="tab:red")
    ax.set_ylabel("queries")
    ax.set_title(f"Per-query nDCG@10 against {baseline}")
    ax.tick_params(axis="x", rotation=60)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "win_loss.png", dpi=110)
    plt.close(fig)


def console_table(report: dict) -> str:
    """One dataset's report as aligned text: a row per pipeline, then what each reranker added."""
    lines = [
        f"{report['dataset']} / {report['split']} ({report['queries']} queries; fusion tuned on {report['tuned_on'] or 'nothing: untuned'})"
    ]
    columns = [c for c, v in next(iter(report["pipelines"].values())).items() if not isinstance(v, dict)]
    widths = [max(10, len(c) + 2) for c in columns]
    name_width = max(22, *(len(name) + 2 for name in report["pipelines"]))
    lines.append(f"{'pipeline':<{name_width}}" + "".join(f"{c:>{w}}" for c, w in zip(columns, widths)))
    for name, metrics in report["pipelines"].items():
        lines.append(
            f"{name:<{name_width}}"
            + "".join(f"{metrics[c]:>{w}.4f}" if isinstance(metrics[c], float) else f"{metrics[c]:>{w}}" for c, w in zip(columns, widths))
        )
    return "\n".join(lines + first_stage_table(report["pipelines"]) + baseline_index_table(report.get("baseline_index")))


def baseline_index_table(comparison: dict | None, metric: str = "ndcg@10") -> list[str]:
    """Lines comparing each pipeline with the same pipeline on a baseline index (`hybrid eval --baseline-index`)."""
    if not comparison:
        return []
    lines = [f"against {comparison['index']} ({comparison['model']}), {metric}, paired randomisation test:"]
    for name, row in comparison["pipelines"].items():
        lines.append(
            f"  {name:<22}{row['baseline'][metric]:.4f} -> {row['baseline'][metric] + row[f'{metric}_delta']:.4f} "
            f"({row[f'{metric}_delta']:+.4f}, p = {row['p_value']:.4f}; {row['wins']}/{row['ties']}/{row['losses']} "
            "wins/ties/losses)"
        )
    return lines
