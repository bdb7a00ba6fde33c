"""docs/BENCHMARKS.md and the README's headline table, rendered whole from one run's record (`bench.harness`)."""

from __future__ import annotations

import math
import re
from collections import Counter
from pathlib import Path
from typing import Any

from bench.harness import ALPHA, NOISE

HEADLINE_START, HEADLINE_END = "<!-- headline:start -->", "<!-- headline:end -->"
COMMAND = "bash scripts/benchmarks.sh"


def cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if math.isnan(value):
            return "n/a"
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, (list, tuple)):
        return ", ".join(map(cell, value))
    return str(value).replace("|", "\\|").replace("\n", " ")


def table(rows: list[dict[str, Any]]) -> list[str]:
    if not rows:
        return ["(no rows)"]
    columns = list(dict.fromkeys(column for row in rows for column in row))
    numeric = [all(isinstance(row.get(c), (int, float)) or row.get(c) is None for row in rows) for c in columns]
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---:" if n else "---" for n in numeric) + "|"]
    lines += ["| " + " | ".join(cell(row.get(c)) for c in columns) + " |" for row in rows]
    return lines


def machine_line(machine: dict[str, Any]) -> str:
    gpus = Counter(machine.get("gpus") or [])
    gpu = ", ".join(name if n == 1 else f"{n}x {name}" for name, n in gpus.items()) or (
        f"{machine['faiss_gpus']} GPU(s) seen by FAISS" if machine.get("faiss_gpus") else "no GPU"
    )
    return f"{machine.get('cpu_count')} cores, {machine.get('cpu_model')}, {gpu}"


def header(record: dict[str, Any]) -> list[str]:
    s = record["stamp"]
    versions = ", ".join(f"{name} {version}" for name, version in s["versions"].items())
    not_run = [f"{c['section']} / {c['name']}: {c['status']}" for c in record["cases"] if c["status"] != "ran"]
    ran = [c for c in record["cases"] if c["status"] == "ran"]
    lines = [
        "# Benchmarks",
        "",
        f"Generated from one run by `{COMMAND}` (`python -m bench run`, then `python -m bench render`): do not edit by hand.",
        "",
        "| run | |",
        "|---|---|",
        f"| date | {s['date']}" + (f", resumed {', '.join(s['resumed'])} (the same commit)" if s.get("resumed") else "") + " |",
        f"| commit | `{s['commit']}`{' with uncommitted changes' if s['dirty'] else ''} |",
        f"| machine | {machine_line(s['machine'])} |",
        f"| software | Python {s['machine'].get('python')}, {versions} |",
        f"| dataset | {record['context']['dataset']}{' (quick: smoke-sized cases)' if record['context'].get('quick') else ''} |",
        f"| cases | {len(ran)} ran, {len(record['cases']) - len(ran)} not run here, {sum(c['seconds'] for c in record['cases']):.0f} s |",
    ]
    if record["context"].get("baseline"):
        lines.append(f"| baseline | `{record['context']['baseline']}` (rows named `baseline`) |")
    lines += [
        "",
        f"Ratios compare two measurements taken side by side in this run; a verdict is *within noise* when the "
        f"medians differ by {NOISE:.0%} or less, or when a two-sided Mann-Whitney test over the samples gives "
        f"p >= {ALPHA}.",
    ]
    if not_run:
        lines += ["", "Not run here:", "", *(f"- {line}" for line in not_run)]
    return lines


def render_benchmarks(record: dict[str, Any]) -> str:
    lines = header(record)
    sections: dict[str, list[dict[str, Any]]] = {}
    for case in record["cases"]:
        sections.setdefault(case["section"], []).append(case)
    for section, cases in sections.items():
        lines += ["", f"## {section}"]
        for case in cases:
            lines += [
                "",
                f"### {case['name']}",
                "",
                f"{case['measures']} ({case['status']}" + (f", {case['seconds']:.0f} s" if case["status"] == "ran" else "") + ")",
            ]
            for t in case["tables"]:
                if t["title"] and t["title"] != case["name"]:
                    lines += ["", f"**{t['title']}**"]
                lines += ["", *table(t["rows"])]
                if t["note"]:
                    lines += ["", t["note"]]
    return "\n".join(lines) + "\n"


def render_headline(record: dict[str, Any]) -> str:
    """The README's headline block: the headline cases' first tables, the machine, the reproducing command."""
    s = record["stamp"]
    lines = [HEADLINE_START]
    for case in record["cases"]:
        if case.get("headline") and case["status"] == "ran" and case["tables"]:
            lines += ["", *table(case["tables"][0]["rows"])]
    lines += [
        "",
        f"{record['context']['dataset']}, measured {s['date'][:10]} at `{s['commit']}` on "
        f"{machine_line(s['machine'])}; reproduce with `{COMMAND}` (all figures: [docs/BENCHMARKS.md](docs/BENCHMARKS.md)).",
        HEADLINE_END,
    ]
    return "\n".join(lines)


def write_headline(readme: Path, record: dict[str, Any]) -> None:
    text = readme.read_text()
    pattern = re.compile(re.escape(HEADLINE_START) + ".*?" + re.escape(HEADLINE_END), re.S)
    if not pattern.search(text):
        raise ValueError(f"{readme} has no {HEADLINE_START} ... {HEADLINE_END} block")
    readme.write_text(pattern.sub(lambda _: render_headline(record), text, count=1))
