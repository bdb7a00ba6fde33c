"""The benchmark harness (bench/): its one percentile and comparison rule, a run that survives failing and impossible
cases, and BENCHMARKS.md + the README headline rendered from one record, then updated by a partial run."""

import json
import subprocess
import sys

import numpy as np
import pytest

from bench.catalog import CASES, select
from bench.harness import NOISE, Case, Table, compare, interleaved, percentiles, run_cases, verdict
from bench.render import HEADLINE_END, HEADLINE_START, UPDATED, render_benchmarks, update_benchmarks, write_headline
from tests.conftest import REPO


def test_percentiles_are_numpys():
    values = [float(v) for v in np.random.default_rng(0).exponential(5, 1001)]
    p50, p95, p99 = np.percentile(values, [50, 95, 99])
    assert percentiles(values) == {"p50_ms": round(p50, 3), "p95_ms": round(p95, 3), "p99_ms": round(p99, 3)}
    assert all(np.isnan(v) for v in percentiles([]).values())


def test_interleaved_calls_take_turns_going_first():
    """Each call runs on every input, and each is the first on an input as often as the others (one that always ran
    second found the first's data in the caches)."""
    order: list[tuple[str, int]] = []
    calls = {name: (lambda x, name=name: order.append((name, x))) for name in "abc"}
    times = interleaved(calls, list(range(6)), warmup=0)
    assert [len(t) for t in times.values()] == [6, 6, 6]
    firsts = [order[3 * i][0] for i in range(6)]
    assert firsts == ["a", "b", "c", "a", "b", "c"]
    assert sorted(order) == sorted((name, x) for name in "abc" for x in range(6))


def test_a_verdict_needs_a_change_beyond_noise_and_a_significant_sample():
    assert verdict(1 + NOISE) == "within noise" and verdict(1 - NOISE) == "within noise"
    assert verdict(1.2) == "better" and verdict(0.8) == "worse"
    assert verdict(1.2, higher_is_better=False) == "worse"  # 20% more milliseconds
    assert verdict(1.5, p_value=0.2) == "within noise"
    slow, fast = [10.0, 11.0, 12.0, 10.5, 11.5] * 4, [5.0, 5.5, 6.0, 5.2, 5.8] * 4
    result = compare(fast, slow)  # latencies: lower is better
    assert result["ratio"] == round(np.median(fast) / np.median(slow), 3) and result["p"] < 0.001
    assert result["verdict"] == "better"
    assert compare(slow, slow)["verdict"] == "within noise"


class FakeContext:
    def has(self, need):
        return need != "gpu"

    def why_not(self, need):
        return f"no {need} here"

    def describe(self):
        return {"dataset": "tinyset", "quick": True, "baseline": None}


def _record():
    cases = [
        Case(
            "Speed",
            "ok",
            "what it runs",
            lambda ctx: [Table("t", [{"name": "a", "p50 ms": 1.23456, "n": 12_345}, {"name": "b|c", "p50 ms": None, "n": 2}])],
            headline=True,
        ),
        Case("Speed", "broken", "raises", lambda ctx: 1 / 0),
        Case("GPU", "needs a gpu", "never runs here", lambda ctx: pytest.fail("ran without its resource"), needs=("gpu",)),
    ]
    return run_cases(cases, FakeContext(), progress=lambda line: None)


def test_a_run_records_every_case_with_its_status_and_keeps_going():
    record = _record()
    statuses = [case["status"] for case in record["cases"]]
    assert statuses == ["ran", "failed: ZeroDivisionError: division by zero", "skipped: no gpu here"]
    stamp = record["stamp"]
    assert stamp["commit"] and stamp["date"][:4].isdigit() and stamp["machine"]["cpu_count"] >= 1
    assert "numpy" in stamp["versions"]
    assert record["cases"][0]["tables"][0]["rows"][0] == {"name": "a", "p50 ms": 1.23456, "n": 12_345}
    json.dumps(record)  # a record is plain JSON


def test_an_interrupted_run_resumes_keeping_the_cases_that_ran():
    runs = {"first": 0, "second": 0}

    def counted(name, fails=False):
        def run(ctx):
            runs[name] += 1
            if fails:
                raise RuntimeError("interrupted")
            return [Table(name, [{"runs": runs[name]}])]

        return run

    saved = []
    first = [Case("S", "first", "-", counted("first")), Case("S", "second", "-", counted("second", fails=True))]
    record = run_cases(first, FakeContext(), progress=lambda line: None, save=lambda r: saved.append(json.loads(json.dumps(r))))
    assert [[c["name"] for c in r["cases"]] for r in saved] == [["first"], ["first", "second"]]  # saved after each case
    again = [Case("S", "first", "-", counted("first")), Case("S", "second", "-", counted("second"))]
    resumed = run_cases(again, FakeContext(), progress=lambda line: None, resumed=saved[-1])
    assert runs == {"first": 1, "second": 2}  # the case that ran is kept, the failed one runs again
    assert [(c["name"], c["status"]) for c in resumed["cases"]] == [("first", "ran"), ("second", "ran")]
    assert resumed["cases"][0] == record["cases"][0] and len(resumed["stamp"]["resumed"]) == 1


def test_the_document_states_when_where_and_what_did_not_run():
    record = _record()
    text = render_benchmarks(record)
    stamp = record["stamp"]
    assert text.startswith("# Benchmarks\n") and f"| date | {stamp['date']} |" in text
    assert f"`{stamp['commit']}`" in text and f"{stamp['machine']['cpu_count']} cores" in text
    assert "- Speed / broken: failed: ZeroDivisionError" in text and "- GPU / needs a gpu: skipped: no gpu here" in text
    assert "| name | p50 ms | n |\n|---|---:|---:|\n| a | 1.235 | 12,345 |\n| b\\|c |  | 2 |" in text
    assert text.index("## Speed") < text.index("## GPU")


def test_the_headline_block_is_replaced_and_nothing_else(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"# Title\n\nintro\n\n{HEADLINE_START}\nold figures\n{HEADLINE_END}\n\n## More\n")
    write_headline(readme, _record())
    text = readme.read_text()
    assert text.startswith("# Title\n\nintro\n\n" + HEADLINE_START) and text.endswith(HEADLINE_END + "\n\n## More\n")
    assert "old figures" not in text and "| a | 1.235 | 12,345 |" in text and "bash scripts/benchmarks.sh" in text
    (tmp_path / "bare.md").write_text("# no block\n")
    with pytest.raises(ValueError, match="headline:start"):
        write_headline(tmp_path / "bare.md", _record())


def _partial_record():
    cases = [
        Case("Speed", "broken", "raises", lambda ctx: [Table("fixed", [{"name": "fixed", "ms": 2.5}])]),
        Case("Speed", "new", "added since", lambda ctx: [Table("new", [{"x": 1}])]),
        Case("Late", "last", "a new section", lambda ctx: 1 / 0),
    ]
    record = run_cases(cases, FakeContext(), progress=lambda line: None)
    record["context"]["quick"] = False
    return record


def test_a_partial_run_replaces_its_cases_and_keeps_the_others():
    whole = _record()
    text = render_benchmarks(whole)
    partial = _partial_record()
    order = [("Speed", "ok"), ("Speed", "new"), ("Speed", "broken"), ("GPU", "needs a gpu"), ("Late", "last")]
    updated = update_benchmarks(text, partial, order)
    stamp = partial["stamp"]
    run = f"run of {stamp['date'][:10]} at `{stamp['commit']}`" + (" with uncommitted changes" if stamp["dirty"] else "")
    # the case that failed before now ran: its block and its "not run" line are this run's
    assert "- Speed / broken: failed" not in updated and "| fixed | 2.5 |" in updated
    assert f"raises (ran, 0 s, {run})" in updated
    # the case the partial run did not touch is byte for byte what it was, its "not run" line kept
    ok_block = text[text.index("### ok") : text.index("### broken")]
    assert ok_block in updated and "- GPU / needs a gpu: skipped: no gpu here" in updated
    assert f"- Late / last: failed: ZeroDivisionError: division by zero ({run})" in updated
    # the catalog's order, a new case in its place and a new section at its end
    positions = [updated.index(heading) for heading in ("### ok", "### new", "### broken", "## GPU", "## Late")]
    assert positions == sorted(positions)
    row = f"| re-run | {stamp['date']}, commit `{stamp['commit']}`, {stamp['machine']['cpu_count']} cores"
    assert row in updated and UPDATED in updated and "Python" not in updated.split(row)[1].split("\n")[0]  # same software
    newer = _partial_record()
    newer["stamp"]["versions"]["numpy"] = "99.0"
    assert "numpy 99.0" in update_benchmarks(text, newer, order).split("| re-run |")[1].split("\n")[0]
    # the same record twice changes nothing; another run adds its row and replaces the first update's block
    assert update_benchmarks(updated, partial, order) == updated
    later = _partial_record()
    later["stamp"]["date"] = "2099-01-01T00:00:00+00:00"
    again = update_benchmarks(updated, later, order)
    assert again.count("| re-run |") == 2 and again.count(UPDATED) == 1 and again.count("### broken") == 1
    assert "run of 2099-01-01" in again[again.index("### broken") :].split("\n")[2]
    quick = _partial_record()
    quick["context"]["quick"] = True
    with pytest.raises(ValueError, match="quick"):
        update_benchmarks(text, quick, order)


def test_a_document_updated_by_an_empty_run_keeps_every_case():
    text = render_benchmarks(_record())
    empty = run_cases([], FakeContext(), progress=lambda line: None)
    empty["context"]["quick"] = False
    assert update_benchmarks(text, empty, []) == text


def test_a_case_an_update_could_not_run_keeps_its_earlier_figures():
    """A re-run on a machine without the case's resource (or where it failed) does not wipe what an earlier run
    measured; the "not run here" line says which run missed it."""
    whole = run_cases(
        [Case("Speed", "ok", "what it runs", lambda ctx: [Table("t", [{"p50 ms": 1.5}])])], FakeContext(), progress=lambda line: None
    )
    text = render_benchmarks(whole)
    missed = run_cases([Case("Speed", "ok", "what it runs", lambda ctx: 1 / 0)], FakeContext(), progress=lambda line: None)
    missed["context"]["quick"] = False
    updated = update_benchmarks(text, missed, [("Speed", "ok")])
    assert text[text.index("### ok") :] in updated and "| 1.5 |" in updated
    assert "- Speed / ok: failed: ZeroDivisionError: division by zero (run of" in updated
    assert "its figures are from an earlier run)" in updated and "1 cases ran" not in updated


def test_an_update_keeps_cases_outside_the_catalog_and_moves_a_renamed_section():
    text = render_benchmarks(_record())
    cases = [
        Case("Fast", "ok", "the same case in a renamed section", lambda ctx: [Table("t", [{"p50 ms": 0.5}])]),
        Case("Speed", "brand new", "not in the catalog yet", lambda ctx: [Table("t", [{"x": 7}])]),
    ]
    record = run_cases(cases, FakeContext(), progress=lambda line: None)
    record["context"]["quick"] = False
    updated = update_benchmarks(text, record, [("Fast", "ok"), ("Speed", "broken"), ("GPU", "needs a gpu")])
    assert updated.count("### ok") == 1 and "## Fast" in updated and "| 0.5 |" in updated
    assert "### brand new" in updated and "| 7 |" in updated
    assert "| cases | 1 ran, 2 did not," in updated  # the first run's row, as it ran


def test_an_update_names_its_baseline_and_refuses_another_dataset():
    text = render_benchmarks(_record())
    record = _partial_record()
    record["context"]["baseline"] = "v1.0"
    row = next(line for line in update_benchmarks(text, record, []).split("\n") if line.startswith("| re-run |"))
    assert "baseline `v1.0` (rows named `baseline`)" in row
    record["context"]["dataset"] = "nfcorpus"
    with pytest.raises(ValueError, match="nfcorpus"):
        update_benchmarks(text, record, [])


def test_the_catalog_names_each_case_once_and_selects_by_section_or_name():
    names = [(case.section, case.name) for case in CASES]
    assert len(names) == len(set(names))
    assert [case.name for case in select(["hubness"])] == ["Correction overhead", "Fitting memory"]
    assert "Headline" not in [case.name for case in select(skip=["quality"])]
    with pytest.raises(SystemExit, match="Quality / Headline"):
        select(["no such section"])
    assert sum(case.headline for case in CASES) == 1


def test_without_a_gpu_the_gpu_case_refuses_clearly():
    from bench.gpu_bench import check_gpu
    from bench.machine import describe_machine
    from hybrid_retrieval.search.dense import gpu_count

    if "CUDAExecutionProvider" in describe_machine()["onnx_providers"] and gpu_count():
        pytest.skip("this machine has a GPU: the refusal cannot be shown")
    with pytest.raises(Exception, match="FAISS sees 0 GPU"):
        check_gpu()


@pytest.mark.process
def test_bench_lists_its_cases_from_a_checkout():
    listed = subprocess.run([sys.executable, "-m", "bench", "list"], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert listed.returncode == 0, listed.stderr
    assert len(listed.stdout.splitlines()) == len(CASES) and "Scale-out / Scale-out on Ray (needs ray)" in listed.stdout


def test_the_header_counts_runs_and_a_section_mixing_cpus_says_so():
    text = render_benchmarks(_record())
    cpu = _record()["stamp"]["machine"]["cpu_model"]
    assert f"Rendered from 1 run on {cpu}." in text and "different CPUs" not in text
    assert "| run | |\n|---|---|\n" in text  # the note goes after the run table, not inside it
    other = _partial_record()
    other["stamp"]["machine"]["cpu_model"] = "Other CPU 9000"
    other["stamp"]["commit"] = "0123456789ab"
    order = [("Speed", "ok"), ("Speed", "new"), ("Speed", "broken"), ("GPU", "needs a gpu"), ("Late", "last")]
    updated = update_benchmarks(text, other, order)
    first, second = sorted([cpu, "Other CPU 9000"])
    assert f"Rendered from 2 runs on {first} and {second}: figures compare only within a case" in updated
    assert "| run | |\n|---|---|\n" in updated
    speed = updated[updated.index("## Speed") : updated.index("### ok")]
    assert "measured on different CPUs" in speed and "Other CPU 9000: new, broken" in speed and f"{cpu}: ok" in speed
    late = updated[updated.index("## Late") :]
    assert "different CPUs" not in late  # one case, one run
    assert update_benchmarks(updated, other, order) == updated  # rendering again adds nothing


def test_the_sizing_page_fits_memory_and_disk_a_document_from_the_load_case():
    from bench.sizing import render_sizing

    sizes = [100_000, 300_000, 1_000_000]
    memory_mib = [(200 * 2**20 + 1_500 * n) / 2**20 for n in sizes]  # 200 MiB + 1,500 bytes a document, exactly
    rows = [
        {"measurement": "memory after a restart and the searches, MiB", **{f"{n:,}": m for n, m in zip(sizes, memory_mib)}},
        {"measurement": "disk bytes a document", **{f"{n:,}": 3_000.0 for n in sizes}},
        {"measurement": "disk bytes a document: vectors", **{f"{n:,}": 256.0 for n in sizes}},
        {"measurement": "hybrid p50 ms, compacted", **{f"{n:,}": 10.0 + n / 1e5 for n in sizes}},
    ]
    stamp = {"date": "2026-11-28T00:00:00", "commit": "abc", "machine": {"cpu_count": 2, "cpu_model": "X"}}
    case = {"section": "A million documents", "name": "API load at scale", "status": "ran", "tables": [{"title": "t", "rows": rows}]}
    page = render_sizing([{"stamp": stamp, "cases": [case]}])
    assert "**200 MiB** (the process and its libraries) plus **1,500 bytes a document**" in page
    assert f"| 1,000,000 | {round((200 * 2**20 + 1_500 * 10**6) / 10**6):,} | 3,000 |" in page
    assert f"| 8 | {int((8 * 2**30 * 0.75 - 200 * 2**20) / 1_500):,} | 1,000,000 |" in page
    assert "| vectors | 256 |" in page
    with pytest.raises(ValueError, match="API load at scale"):
        render_sizing([{"stamp": stamp, "cases": []}])
