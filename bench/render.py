"""docs/BENCHMARKS.md and the README's headline table, rendered from run records (`bench.harness`).

`render_benchmarks` writes the document whole from one run. `update_benchmarks` replaces only the cases a later,
partial run measured (`python -m bench run --only ...`), so a changed default is re-measured in minutes instead of
the hours of a whole run; each re-run case names its run, and the header lists every run the document holds.
"""

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


def software(stamp: dict[str, Any]) -> str:
    return f"Python {stamp['machine'].get('python')}, " + ", ".join(f"{name} {version}" for name, version in stamp["versions"].items())


RATIOS = (
    "Ratios compare two measurements taken side by side in the same run (a case runs whole in one run); a verdict is "
    f"*within noise* when the medians differ by {NOISE:.0%} or less, or when a two-sided Mann-Whitney test over the "
    f"samples gives p >= {ALPHA}."
)


def header(record: dict[str, Any]) -> list[str]:
    s = record["stamp"]
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
        f"| software | {software(s)} |",
        f"| dataset | {record['context']['dataset']}{' (quick: smoke-sized cases)' if record['context'].get('quick') else ''} |",
        f"| cases | {len(ran)} ran, {len(record['cases']) - len(ran)} did not, {sum(c['seconds'] for c in record['cases']):.0f} s |",
    ]
    if record["context"].get("baseline"):
        lines.append(f"| baseline | `{record['context']['baseline']}` (rows named `baseline`) |")
    lines += ["", RATIOS]
    if not_run:
        lines += ["", "Not run here:", "", *(f"- {line}" for line in not_run)]
    return lines


def case_block(case: dict[str, Any], run: str = "") -> list[str]:
    """One case's heading, what it measures, its status and its tables; `run` names the run when the document holds several."""
    status = case["status"] + (f", {case['seconds']:.0f} s" if case["status"] == "ran" else "") + (f", {run}" if run else "")
    lines = [f"### {case['name']}", "", f"{case['measures']} ({status})"]
    for t in case["tables"]:
        if t["title"] and t["title"] != case["name"]:
            lines += ["", f"**{t['title']}**"]
        lines += ["", *table(t["rows"])]
        if t["note"]:
            lines += ["", t["note"]]
    return lines


def body(blocks: dict[tuple[str, str], list[str]]) -> list[str]:
    """Case blocks under their sections; a section renders where its first case is."""
    sections: dict[str, list[list[str]]] = {}
    for (section, _), block in blocks.items():
        sections.setdefault(section, []).append(block)
    lines: list[str] = []
    for section, cases in sections.items():
        lines += ["", f"## {section}"]
        for block in cases:
            lines += ["", *block]
    return lines


def render_benchmarks(record: dict[str, Any]) -> str:
    blocks = {(case["section"], case["name"]): case_block(case) for case in record["cases"]}
    return "\n".join(with_provenance(header(record) + body(blocks))) + "\n"


PROVENANCE = "Rendered from "
MIXED = "Cases in this section were measured on different CPUs"
RUN_OF = re.compile(r"run of \S+ at `([0-9a-f]+)`")


def _cpu(machine: str) -> str:
    """The CPU model of a machine_line ("2 cores, AMD EPYC, no GPU")."""
    return machine.split(", ")[1] if machine.count(", ") >= 2 else machine


def with_provenance(lines: list[str]) -> list[str]:
    """The document with a line saying how many runs it was rendered from and on which CPUs, and a warning under
    each section whose cases come from runs on different CPUs (their figures are not comparable across cases)."""
    kept: list[str] = []
    for line in lines:  # the lines an earlier rendering added go, with the blank line before each
        if line.startswith((PROVENANCE, MIXED)):
            kept.pop()
        else:
            kept.append(line)
    lines = kept
    first_commit = next((line.split("`")[1] for line in lines if line.startswith("| commit |")), "")
    first_cpu = next((_cpu(line.split("|")[2].strip()) for line in lines if line.startswith("| machine |")), "")
    cpu_of = {first_commit: first_cpu}
    for line in lines:
        if line.startswith("| re-run |") and "commit `" in line:
            commit, rest = line.split("commit `", 1)[1].split("`, ", 1)
            cpu_of.setdefault(commit, _cpu(rest.split(":")[0]))
    runs = 1 + sum(line.startswith("| re-run |") for line in lines)
    cpus = sorted(set(cpu_of.values()))
    note = f"{PROVENANCE}{runs} run{'s' if runs > 1 else ''} on {' and '.join(cpus)}"
    note += (
        ": figures compare only within a case (one run, one machine), and a section whose cases ran on different CPUs says so."
        if len(cpus) > 1
        else "."
    )
    table_end = next((i for i, line in enumerate(lines) if i and lines[i - 1].startswith("|") and not line.startswith("|")), 0)
    out = lines[:table_end] + ["", note] + lines[table_end:]
    return _section_warnings(out, cpu_of, first_cpu)


def _section_warnings(lines: list[str], cpu_of: dict[str, str], first_cpu: str) -> list[str]:
    """A warning under each section heading whose cases name runs on different CPUs (a case's status line, the first
    line after its heading, names its run when it is not the first)."""
    sections: list[tuple[int, dict[str, list[str]]]] = []
    for i, line in enumerate(lines):
        if line.startswith("## "):
            sections.append((i, {}))
        elif line.startswith("### ") and sections:
            status = next((later for later in lines[i + 1 :] if later), "")
            found = RUN_OF.search(status)
            cpu = cpu_of.get(found.group(1), first_cpu) if found else first_cpu
            sections[-1][1].setdefault(cpu, []).append(line[4:])
    out = list(lines)
    for at, by_cpu in reversed(sections):
        if len(by_cpu) > 1:
            where = "; ".join(f"{cpu}: {', '.join(names)}" for cpu, names in sorted(by_cpu.items()))
            out[at + 1 : at + 1] = ["", f"{MIXED} ({where}): compare figures only within a case."]
    return out


UPDATED = (
    "Cases re-run since by `python -m bench render RECORD --update` name their run, and each such run has a `re-run` row; "
    "the rows above those describe the first run."
)


def update_benchmarks(text: str, record: dict[str, Any], order: list[tuple[str, str]]) -> str:
    """`text` (a rendered BENCHMARKS.md) with the cases `record` measured replaced or added, every other case kept as
    it was; cases in `order` (the catalog's), then any the catalog does not have. A case the record holds but did not
    run (skipped, failed) keeps the figures an earlier run measured, and its "not run here" line says so. The header
    gains a row for this run. A record that holds no case changes nothing."""
    if record["context"].get("quick"):
        raise ValueError("a quick run's smoke-sized figures do not go into BENCHMARKS.md: run without --quick")
    if not record["cases"]:
        return text
    lines = text.rstrip("\n").split("\n")
    dataset = next((line.split("|")[2].split(" (")[0].strip() for line in lines if line.startswith("| dataset |")), None)
    if dataset is not None and dataset != record["context"]["dataset"]:
        raise ValueError(f"the record measured {record['context']['dataset']!r}, the document {dataset!r}: render it whole instead")
    first_section = next((i for i, line in enumerate(lines) if line.startswith("## ")), len(lines))
    head, old = lines[:first_section], _blocks(lines[first_section:])
    shown_not_run = {line[2:].split(": ", 1)[0] for line in head if line.startswith("- ")}
    s = record["stamp"]
    run = f"run of {s['date'][:10]} at `{s['commit']}`{' with uncommitted changes' if s['dirty'] else ''}"
    new, kept = {}, set()
    for case in record["cases"]:
        key, label = (case["section"], case["name"]), f"{case['section']} / {case['name']}"
        earlier = next((k for k in old if k[1] == case["name"]), None)  # its section may have been renamed since
        if case["status"] != "ran" and earlier is not None and f"{earlier[0]} / {earlier[1]}" not in shown_not_run:
            kept.add(label)
        else:
            new[key] = case_block(case, run)
            old = {k: b for k, b in old.items() if k[1] != case["name"]}
    merged = {key: new.get(key) or old[key] for key in order if key in new or key in old}
    merged |= {key: block for key, block in (new | old).items() if key not in merged}
    return "\n".join(with_provenance(_updated_header(head, record, run, kept) + body(merged))) + "\n"


def _blocks(lines: list[str]) -> dict[tuple[str, str], list[str]]:
    """The case blocks of a rendered body, keyed by (section, case), each without its surrounding blank lines."""
    blocks: dict[tuple[str, str], list[str]] = {}
    section = ""
    current: list[str] | None = None
    for line in lines:
        if line.startswith("## "):
            section, current = line[3:], None
        elif line.startswith("### "):
            current = blocks[(section, line[4:])] = [line]
        elif current is not None:
            current.append(line)
    for block in blocks.values():
        while block and not block[-1]:
            block.pop()
    return blocks


def _updated_header(head: list[str], record: dict[str, Any], run: str, kept: set[str]) -> list[str]:
    """The header with a row for this run, and its cases' former "not run here" lines replaced by this run's (`kept`:
    the cases shown as an earlier run measured them)."""
    s = record["stamp"]
    ran = [c for c in record["cases"] if c["status"] == "ran"]
    names = {c["name"] for c in record["cases"]}
    not_run = [line for line in head if line.startswith("- ") and line[2:].split(": ", 1)[0].split(" / ", 1)[-1] not in names]
    for case in record["cases"]:
        label = f"{case['section']} / {case['name']}"
        if case["status"] != "ran":
            earlier = "; its figures are from an earlier run" if label in kept else ""
            not_run.append(f"- {label}: {case['status']} ({run}{earlier})")
    out = list(head[: head.index("Not run here:")] if "Not run here:" in head else head)
    out = [RATIOS if line.startswith("Ratios compare") else line for line in out]  # as this code words it
    out = [line.replace(" not run here, ", " did not, ") if line.startswith("| cases |") else line for line in out]
    generated = next(i for i, line in enumerate(out) if line.startswith("Generated from one run"))
    out[generated] = out[generated].split(" Cases re-run since", 1)[0] + f" {UPDATED}"
    date = s["date"] + (f", resumed {', '.join(s['resumed'])}" if s.get("resumed") else "")
    baseline = f", baseline `{record['context']['baseline']}` (rows named `baseline`)" if record["context"].get("baseline") else ""
    row = (
        f"| re-run | {date}, commit `{s['commit']}`, {machine_line(s['machine'])}"
        + ("" if f"| software | {software(s)} |" in out else f", {software(s)}")
        + f"{baseline}: {len(ran)} cases ran, {len(record['cases']) - len(ran)} not, {sum(c['seconds'] for c in record['cases']):.0f} s |"
    )
    if row not in out:  # the same record rendered twice
        out.insert(max(i for i, line in enumerate(out) if line.startswith("| ")) + 1, row)
    while out and not out[-1]:
        out.pop()
    return out + (["", "Not run here:", "", *not_run] if not_run else [])


def _headline_cases(record: dict[str, Any]) -> list[dict[str, Any]]:
    return [case for case in record["cases"] if case.get("headline") and case["status"] == "ran" and case["tables"]]


def has_headline(record: dict[str, Any]) -> bool:
    """Whether the record measured a headline case (a partial run may not have)."""
    return bool(_headline_cases(record))


def render_headline(record: dict[str, Any]) -> str:
    """The README's headline block: the headline cases' first tables, the machine, the reproducing command."""
    s = record["stamp"]
    lines = [HEADLINE_START]
    for case in _headline_cases(record):
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
