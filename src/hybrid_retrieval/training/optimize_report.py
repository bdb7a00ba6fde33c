"""The report of `hybrid optimize` (training.optimize): JSON, markdown and a chart of each step's held-out score."""

from __future__ import annotations

import json
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path

from hybrid_retrieval.common.publish import write_atomic
from hybrid_retrieval.indexer.manifest import Manifest
from hybrid_retrieval.models.cross_encoder import rerank_weight


def summary(
    state, split, comparison: tuple[float, float, float, list[int]], metric: str, alpha: float, work: Path, final: Manifest
) -> dict:
    """The report of a finished run: `comparison` is the start against the final state on the held-out part (means,
    p, wins/ties/losses); `work` the run's work folder; `final` the final state's manifest."""
    before, after, p, counts = comparison
    reranker = (work / state.reranker) if state.reranker else None
    return {
        "index": str(work.parent),
        "split": {**split.source, "fit_queries": len(split.fit), "held_out_queries": len(split.held_out), "held_out_ids": split.held_out},
        "budget_seconds": state.budget_seconds,
        "spent_seconds": state.spent_seconds,
        "costs": state.costs,
        "held_out": {
            "metric": metric,
            "queries": len(split.held_out),
            "start": round(before, 4),
            "final": round(after, 4),
            "p_value": round(p, 4),
            "wins_ties_losses": counts,
            "alpha": alpha,
            "improved": after > before and p < alpha,
        },
        "steps": [asdict(step) for step in state.steps],
        "served": {
            "model": final.embedder.model,
            "defaults": final.defaults.to_string(),
            "reranker": {"weight": rerank_weight(reranker)} if reranker is not None and reranker.exists() else None,
        },
        "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def markdown(report: dict) -> str:
    held = report["held_out"]
    lines = [
        f"# hybrid optimize: {report['index']}",
        "",
        f"Judged queries: {report['split']['judged_queries']} of {report['split']['qrels']}; fitted on "
        f"{report['split']['fit_queries']}, judged on {held['queries']} held out (never fitted on). A step is kept when "
        f"it beats the state before it on the held-out queries (paired randomisation test, p < {held['alpha']}).",
        "",
        f"Budget {report['budget_seconds'] / 60:.0f} min, spent {report['spent_seconds'] / 60:.1f} min.",
        "",
        f"| step | decision | held-out {held['metric']} before | after | p | wins/ties/losses | seconds | peak RSS MiB | why |",
        "|---|---|---:|---:|---:|---|---:|---:|---|",
    ]
    for step in report["steps"]:
        wtl = "/".join(map(str, step["wins_ties_losses"])) if step["wins_ties_losses"] else ""

        def num(value):
            return "" if value is None else f"{value:.4f}"

        lines.append(
            f"| {step['name']} | {step['decision']} | {num(step['before'])} | {num(step['after'])} | {num(step['p_value'])} | {wtl} | "
            f"{step['seconds']:,.0f} | {step['peak_rss_mib']:,.0f} | {step['why']} |"
        )
    lines += [
        "",
        f"Start {held['start']:.4f} -> final {held['final']:.4f} on the held-out queries (p {held['p_value']:.4f}, "
        f"wins/ties/losses {'/'.join(map(str, held['wins_ties_losses']))}).",
        "",
        f"Served: model {report['served']['model']}, defaults `{report['served']['defaults']}`"
        + (f", reranker at weight {report['served']['reranker']['weight']:g}" if report["served"]["reranker"] else ", no reranker")
        + ".",
        "",
        f"Result: {report['published']}.",
    ]
    if report.get("evidence_note"):
        lines += ["", f"Note: {report['evidence_note']}."]
    return "\n".join(lines) + "\n"


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    held = report["held_out"]
    names, values, colours = ["start"], [held["start"]], ["grey"]
    for step in report["steps"]:
        if step["after"] is None:
            continue
        names.append(f"{step['name']}\n({step['decision']})")
        values.append(step["after"])
        colours.append("tab:green" if step["decision"] == "kept" else "tab:red")
    fig, ax = plt.subplots(figsize=(max(5, 1.4 * len(names)), 4))
    ax.bar(names, values, color=colours)
    low = min(values)
    ax.set_ylim(max(0.0, low - 0.05), min(1.0, max(values) + 0.02))
    for i, value in enumerate(values):
        ax.text(i, value, f"{value:.4f}", ha="center", va="bottom", fontsize=8)
    ax.set_ylabel(f"held-out {held['metric']} ({held['queries']} queries)")
    ax.set_title("hybrid optimize: each step against the state before it")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(report: dict, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    write_atomic(folder / "report.json", json.dumps(report, indent=2))
    write_atomic(folder / "report.md", markdown(report))
    plot(report, folder / "report.png")
