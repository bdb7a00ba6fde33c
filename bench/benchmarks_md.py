"""Render docs/BENCHMARKS.md from the JSON that `hybrid index`, `hybrid eval` and `hybrid bench` wrote.

Usage: python -m bench.benchmarks_md INDEX_DIR EVAL_REPORT_JSON BENCH_JSON [HUBNESS_MEMORY_JSON [LOAD_TEST_JSON]] > docs/BENCHMARKS.md
"""

from __future__ import annotations

import json
import platform
import re
import sys
from collections import Counter
from dataclasses import asdict
from pathlib import Path

from hybrid_retrieval.evaluation import filter_bench, live_bench, query_bench, rerank_bench, serving_bench
from bench.machine import cpu_model as _cpu_model
from hybrid_retrieval.evaluation.report import first_stage_table
from hybrid_retrieval.indexer.manifest import Manifest, read_manifest
from hybrid_retrieval.search.fusion import fusion_to_string
from hybrid_retrieval.training.hubness import candidate_name

# Published scifact test-split numbers (../shared/data/beir/README.md lists their sources).
REFERENCES = [
    ("BM25, bm25s Lucene k1=1.5 b=0.75, Snowball + English stopwords", 0.687, None),
    ("BM25, Elasticsearch multifield (BEIR paper)", 0.665, 0.908),
    ("BM25, Pyserini flat (k1=0.9, b=0.4)", 0.679, 0.925),
    ("dense, all-MiniLM-L6-v2 (MTEB)", 0.645, None),
]


# Two measurements closer than this (relative) are reported as "within noise", not as a win for either side.
NOISE = 0.03


def _change(new: float, old: float) -> float:
    """Relative change from `old` to `new` (0.2 = 20% more)."""
    if old == 0:
        return 0.0 if new == 0 else float("inf")
    return new / old - 1


def _verdict(change: float, up: str, down: str, same: str = "within noise") -> str:
    """"<up> by 20%", "<down> by 17%" or "<same> at +1.2%", from a relative change."""
    if abs(change) <= NOISE:
        return f"{same} at {change:+.1%}"
    return f"{up if change > 0 else down} by {abs(change):.0%}"


def _tally(changes: list[float]) -> str:
    """How many of the changes went each way: "2 up, 1 down, 0 within noise"."""
    up, down = sum(c > NOISE for c in changes), sum(c < -NOISE for c in changes)
    return f"{up} up, {down} down, {len(changes) - up - down} within noise"


def _gpu_phrase(machine: dict) -> str:
    """The GPUs a bench run saw, from evaluation.machine.describe_machine()'s record."""
    names = Counter(machine.get("gpus") or [])
    faiss_gpus = machine.get("faiss_gpus") or 0
    if not names:
        return f"{faiss_gpus} GPU(s) visible to FAISS (no names from nvidia-smi)" if faiss_gpus else "no GPU seen"
    listed = ", ".join(name if n == 1 else f"{n}x {name}" for name, n in names.items())
    seen_by = [f"FAISS saw {faiss_gpus}"]
    if machine.get("onnx_providers"):
        seen_by.append(f"ONNX Runtime providers {', '.join(machine['onnx_providers'])}")
    return f"GPU {listed} ({'; '.join(seen_by)})"


def machine_line(bench: dict, versions: dict) -> str:
    """The Machine line: the device the bench run recorded, or, for JSON without a record, what can be read now."""
    machine = bench.get("machine")
    if machine:
        cores = machine.get("cpu_count") or bench.get("cpu_count")
        cpu = machine.get("cpu_model") or machine.get("cpu") or "unknown CPU"
        device, python = _gpu_phrase(machine), machine.get("python") or platform.python_version()
    else:  # older bench JSON: the CPU is read at render time and the GPU is unknown, so nothing is claimed about it
        cores, cpu, device, python = bench.get("cpu_count"), _cpu_model(), "GPU not recorded", platform.python_version()
    libraries = ", ".join(f"{name} {versions.get(name, 'unknown')}" for name in ("faiss", "onnxruntime", "bm25s"))
    return f"Machine: {cores if cores is not None else 'unknown'} cores, {cpu}, {device}; Python {python}; {libraries}."


def build_sentence(build: dict, documents: int) -> str:
    """Build throughput and which stage took most of the build time."""
    stages = {s.removesuffix("_s"): build[s] for s in ("documents_s", "bm25_s", "embeddings_s", "faiss_s") if s in build}
    sentence = f"Throughput: {documents / build['total_s']:.1f} docs/s"
    if stages and build["total_s"] > 0:
        top = max(stages, key=stages.get)
        sentence += f"; the {top} stage took {stages[top] / build['total_s']:.0%} of the build time"
    return sentence + "."


def parallel_legs_sentence(latency: dict) -> str:
    """Each fusion's p50 with the legs run concurrently vs one after the other (pipeline_latency rows)."""
    parts = []
    for name, row in latency.items():
        concurrent = latency.get(f"{name}, concurrent legs")
        if concurrent is None or name.endswith(", concurrent legs"):
            continue
        change = _change(concurrent["p50_ms"], row["p50_ms"])
        verdict = _verdict(change, "raised p50 latency", "lowered p50 latency", "left p50 latency within noise")
        part = (f"for {name} they {verdict} "
                f"({concurrent['p50_ms']:.2f} vs {row['p50_ms']:.2f} ms")
        bm25 = row.get("stage_p50_ms", {}).get("bm25")
        if bm25 is not None:
            part += f"; the BM25 stage it overlaps had a median of {bm25:.2f} ms"
        parts.append(part + ")")
    if not parts:
        return ""
    return f"Measured here, concurrent legs: {'; '.join(parts)}."


def http_scaling_sentence(http: dict) -> str:
    """Throughput and latency at the highest concurrency vs the lowest (http_load rows "N clients")."""
    rows = sorted((int(name.split()[0]), row) for name, row in http.items())
    if len(rows) < 2:
        return ""
    (low, first), (high, last) = rows[0], rows[-1]
    change = _change(last["throughput_rps"], first["throughput_rps"])
    peak_clients, peak = max(rows, key=lambda r: r[1]["throughput_rps"])
    throughput = _verdict(change, "rose", "fell", "stayed within noise")
    sentence = (f"From {low} to {high} concurrent clients ({high / max(low, 1):g}x the clients), throughput {throughput} "
                f"({first['throughput_rps']:.1f} -> {last['throughput_rps']:.1f} req/s, {1 + change:.2f}x) and p50 latency "
                f"went from {first['p50_ms']:.1f} to {last['p50_ms']:.1f} ms "
                f"({1 + _change(last['p50_ms'], first['p50_ms']):.1f}x). "
                f"Peak throughput: {peak['throughput_rps']:.1f} req/s at {peak_clients} clients.")
    failed = [f"{row['errors']} at {n} clients" for n, row in rows if row.get("errors")]
    sentence += f" Failed requests: {', '.join(failed)}." if failed else " No request failed."
    return sentence


def hubness_overhead_sentence(overhead: dict) -> str:
    """Each hubness correction's dense-leg and search-only p50 vs no correction (hubness_overhead rows)."""
    rows = {name: v for name, v in overhead.items() if name != "none"}
    if not rows:
        return ""
    base = overhead.get("none", {})

    def compare(ratio_key: str, ms_key: str, fmt: str) -> str:
        parts = []
        for name, v in rows.items():
            numbers = f"{v[ms_key]:{fmt}} vs {base[ms_key]:{fmt}} ms" if ms_key in base else f"ratio {v[ratio_key]:.3f}"
            parts.append(f"{name} {_verdict(v[ratio_key] - 1, 'slower', 'faster')} ({numbers})")
        return "; ".join(parts)

    costliest = max(rows, key=lambda name: rows[name]["leg_ratio"])
    leg_change = rows[costliest]["leg_ratio"] - 1
    summary = (f"The costliest on the dense leg was {costliest}, {leg_change:+.1%}." if leg_change > NOISE else
               "Every correction's dense-leg time was within noise of no correction or below it.")
    return (f"Against no correction, the dense leg (embed + search) was: {compare('leg_ratio', 'dense_leg_p50_ms', '.2f')}. "
            f"The search alone was: {compare('search_ratio', 'search_p50_ms', '.3f')}. {summary}")


def batching_sentence(batching: dict) -> str:
    """Batched vs unbatched queries/s and p50 at each load level (batching_tradeoff rows "[un]batched, N clients")."""
    levels = sorted({int(m.group(1)) for key in batching if (m := re.fullmatch(r"(?:un)?batched, (\d+) clients?", key))})
    parts, changes = [], []
    for n in levels:
        unbatched, batched = batching.get(f"unbatched, {n} clients"), batching.get(f"batched, {n} clients")
        if not (unbatched and batched):
            continue
        change = _change(batched["qps"], unbatched["qps"])
        changes.append(change)
        verdict = _verdict(change, "raised throughput", "lowered throughput", "left throughput within noise")
        parts.append(f"at {n} client{'s' if n != 1 else ''} batching {verdict} "
                     f"({batched['qps']:.1f} vs {unbatched['qps']:.1f} queries/s, p50 {batched['p50_ms']:.1f} vs "
                     f"{unbatched['p50_ms']:.1f} ms)")
    if not parts:
        return ""
    return f"Measured here, {'; '.join(parts)}. Batched throughput by load level: {_tally(changes)}."


def faiss_device_sentence(faiss: dict) -> str:
    """FAISS GPU vs CPU batched search at each index type, or that no GPU was visible to FAISS."""
    results = faiss.get("results", {})
    parts = []
    for name, cpu in results.items():
        gpu = results.get(name.removesuffix(" cpu") + " gpu")
        if not (name.endswith(" cpu") and isinstance(cpu, dict) and isinstance(gpu, dict)):
            continue
        change = _change(gpu["qps"], cpu["qps"])
        verdict = ("GPU and CPU were within noise" if abs(change) <= NOISE else
                   f"the GPU was {'faster' if change > 0 else 'slower'}")
        part = (f"for {name.removesuffix(' cpu')} {verdict}: {1 + change:.2f}x the CPU's queries/s "
                f"({gpu['qps']:.0f} vs {cpu['qps']:.0f})")
        recall = next((k for k in cpu if k.startswith("recall@")), None)
        if recall and recall in gpu and abs(gpu[recall] - cpu[recall]) > 1e-3:
            part += f", {recall} {gpu[recall]:.4f} vs {cpu[recall]:.4f}"
        parts.append(part)
    if parts:
        return f"FAISS saw {faiss.get('gpus', 0)} GPU(s); batched search on the GPU vs the CPU: {'; '.join(parts)}."
    if not faiss.get("gpus"):
        return ("No GPU was visible to FAISS on this machine (faiss.get_num_gpus() = 0): GPU rows appear when "
                "`hybrid bench --faiss-vectors N` runs where one is (the same command).")
    return f"FAISS saw {faiss['gpus']} GPU(s), but this run recorded no GPU rows."


def compute_floor_sentence(floor: dict) -> str:
    """The fp32 model on all cores against its floor (evaluation.compute_floor): a query, and passages while indexing."""
    peaks, query, passage = floor["peaks"], floor["query"], floor["passage"]
    cores = peaks["cores"]
    return (f"Compute floor (FLOPs read off the ONNX graph over the real token counts, GEMM peak measured in the same run: "
            f"{peaks['fp32_gflops_1']:.0f} GFLOP/s fp32 on one core, {peaks[f'fp32_gflops_{cores}']:.0f} on {cores}): a query "
            f"({query['mean_tokens']:.0f} tokens, {query['gflop']:.3f} GFLOP) takes {query['measured_ms']:.2f} ms vs a floor of "
            f"{query['floor_ms']:.2f} ms ({query['fraction']:.0%} of peak: one short sequence cannot keep {cores} cores' GEMMs "
            f"full); indexing ({passage['mean_tokens']:.0f} tokens per passage, {passage['gflop']:.2f} GFLOP) runs at "
            f"{passage['measured_per_s']:.1f} passages/s vs a floor of {passage['floor_per_s']:.1f} ({passage['fraction']:.0%} of peak).")


def fusion_sentence(manifest: Manifest) -> str:
    """Which fusion `hybrid` is and why, from the manifest's evidence (what `hybrid tune` decided)."""
    fusion = fusion_to_string(manifest.defaults.fusion)
    evidence = manifest.evidence.get("fusion")
    legend = ("`rrf:K` is RRF with rrf_k = K; `cc:NORM:ALPHA` is the convex combination with that normalisation at the "
              "alpha tuned for it. No test query was used to choose anything.")
    if not evidence:
        return f"`hybrid` is the index's default fusion, `{fusion}` (not tuned). {legend}"
    values = ", ".join(f"{name} {value:.4f}" for name, value in evidence["values"].items())
    return (f"`hybrid` is the index's default fusion, `{fusion}`: `hybrid tune` on {evidence['queries']} queries of "
            f"`{Path(evidence['split']).name}` {evidence['decision']} ({evidence['metric']}: {values}; {evidence['folds']}-fold "
            f"cross-validation). {legend}")


def hubness_default_sentence(manifest: Manifest) -> str:
    hubness, evidence = manifest.defaults.hubness, manifest.evidence.get("hubness")
    if hubness.method == "none":
        return "The index's default is no correction: the rows without a suffix are uncorrected."
    name = candidate_name(hubness)
    if evidence and "values" in evidence:
        values = ", ".join(f"{k} {v:.4f}" for k, v in evidence["values"].items())
        return f"The index's default is {name} ({evidence['decision']}; dense {evidence['metric']} on held-out bank queries: {values})."
    return f"The index's default is {name} ({(evidence or {}).get('decision', 'no evidence recorded')})."


def render(manifest: Manifest, eval_report: dict, bench: dict, memory: dict | None = None, load: dict | None = None,
           filters: dict | None = None, live: dict | None = None, query: dict | None = None, serving: dict | None = None,
           rerank: dict | None = None) -> str:
    build = manifest.build
    lines = [
        "# Benchmarks",
        "",
        "Generated by `bash scripts/benchmarks.sh` (do not edit by hand).",
        "",
        f"{machine_line(bench, manifest.versions)} Below, a difference of {NOISE:.0%} or less is called within noise.",
        "",
        f"## Quality: {eval_report['dataset']} {eval_report['split']} ({eval_report['queries']} queries)",
        "",
        f"| pipeline | nDCG@10 | Recall@100 | MRR@10 | MAP@100 | N10 skewness | vs {eval_report['baseline']}: wins/ties/losses (p) |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for name, m in eval_report["pipelines"].items():
        mark = "†" if m["p_value_vs_baseline"] < 0.05 and name != eval_report["baseline"] else ""
        lines.append(f"| {name}{mark} | {m['ndcg@10']:.4f} | {m['recall@100']:.4f} | {m['mrr@10']:.4f} | {m['map@100']:.4f} "
                     f"| {m['n10_skewness']:.3f} | {m['wins']}/{m['ties']}/{m['losses']} (p={m['p_value_vs_baseline']:.3g}) |")
    lines += ["", f"† nDCG@10 differs from {eval_report['baseline']} at p < 0.05 (paired two-sided randomisation test, "
              "10,000 permutations). Per-dataset report, charts and TREC runs: `runs/<dataset>/` after `scripts/benchmarks.sh`."]
    lines += first_stage_table(eval_report["pipelines"])
    lines += ["", fusion_sentence(manifest)]
    lines += ["", "Published reference numbers on the same split:", "", "| system | nDCG@10 | Recall@100 |", "|---|---:|---:|"]
    for name, ndcg, recall in REFERENCES:
        lines.append(f"| {name} | {ndcg:.3f} | {'' if recall is None else f'{recall:.3f}'} |")
    throughput = bench["bm25_throughput"]
    lines += [
        "",
        f"## Index build ({manifest.documents} documents, FAISS {manifest.faiss.factory}, "
        f"documents embedded with {manifest.embedder.document_backend})",
        "",
        "| stage | seconds |",
        "|---|---:|",
        *(f"| {stage.removesuffix('_s')} | {build[stage]:.1f} |" for stage in ("documents_s", "bm25_s", "embeddings_s", "faiss_s", "total_s")),
        "",
        f"Peak memory of the build: {build['peak_rss_mib']:.0f} MiB. {build_sentence(build, manifest.documents)}",
        "",
        "## BM25 engine vs rank-bm25 (same corpus, analyzer, k1, b; interleaved rounds in one process)",
        "",
        "| engine | queries/s (median of rounds) |",
        "|---|---:|",
        f"| bm25s (ours) | {throughput['engine_qps']:.1f} |",
        f"| rank-bm25 | {throughput['rank_bm25_qps']:.1f} |",
        f"| **ratio** | **{throughput['ratio']:.1f}x** |",
        "",
        f"## In-process query latency ({bench['queries']} queries, k=10, one thread)",
        "",
        "| pipeline | p50 ms | p95 ms | p99 ms | fusion share | stage medians (ms) |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for mode, m in bench["latency"].items():
        stages = ", ".join(f"{s} {v:.2f}" for s, v in m["stage_p50_ms"].items() if s != "total")
        share = f"{m['fusion_share']:.1%}" if "fusion_share" in m else ""
        lines.append(f"| {mode} | {m['p50_ms']:.2f} | {m['p95_ms']:.2f} | {m['p99_ms']:.2f} | {share} | {stages} |")
    lines += ["", " ".join(filter(None, [
        "Fusion share: median over queries of (gathering the missing scores + fusing) / total. "
        "`concurrent legs` runs BM25 in a second thread beside query embedding + dense search; compare it with the row above it.",
        parallel_legs_sentence(bench["latency"]),
        "The service runs the legs concurrently when `HYBRID_PARALLEL_LEGS=on`; `auto` (the default) does so only when "
        "queries are embedded on a GPU."]))]
    lines += ["", "## Dense index types (same stored vectors, one query at a time)", "",
              "| FAISS index | queries/s | recall@10 vs flat | build s |", "|---|---:|---:|---:|"]
    for name, v in bench["dense_indexes"].items():
        lines.append(f"| {name} | {v['qps']:.0f} | {v['recall@10_vs_flat']:.4f} | {v['build_s']:.3f} |")
    lines += ["", "## HTTP end to end (`hybrid serve` on 127.0.0.1, hybrid k=10, bounded request count per level)", "",
              "| concurrent clients | requests | errors | throughput req/s | p50 ms | p95 ms | p99 ms |", "|---|---:|---:|---:|---:|---:|---:|"]
    for name, v in bench["http"].items():
        lines.append(f"| {name.split()[0]} | {v['requests']} | {v['errors']} | {v['throughput_rps']:.1f} | {v['p50_ms']:.1f} | {v['p95_ms']:.1f} | {v['p99_ms']:.1f} |")
    scaling = http_scaling_sentence(bench["http"])
    if scaling:
        lines += ["", scaling]
    if load:
        lines += ["", f"Sustained load (`python -m bench.load_test`, all scifact queries): {load['clients']} clients for "
                  f"{load['seconds']:.0f} s on loopback: {load['requests']} requests, {load['errors']} errors, "
                  f"{load['throughput_rps']:.1f} req/s, p50 {load['p50_ms']:.0f} ms, p95 {load['p95_ms']:.0f} ms, p99 {load['p99_ms']:.0f} ms."]
    hubness = manifest.hubness
    if hubness and "hubness_overhead" in bench:
        lines += [
            "", "## Hubness correction",
            "",
            f"Bank: {hubness.bank['size']} {hubness.bank['kind']}"
            + (f" of `{Path(hubness.bank['split']).name}`" if hubness.bank.get("split") else "")
            + f"; gallery: {hubness.gallery['size']} corpus documents, self-matches excluded. Betas "
            f"{json.dumps(asdict(hubness.params))}" + (f" ({hubness.beta_source['betas']})" if hubness.beta_source else "") + ". "
            + hubness_default_sentence(manifest) + " "
            "`+qbnorm` / `+dbnorm` rows above are the inverted-softmax variants, `:dis` the dynamic ones; "
            "N10 skewness is the skewness of the k-occurrence of the test queries' top-10 over the corpus.",
            "",
            "Dense-leg time (embed + search) with each correction vs without, interleaved query by query in one run:",
            "",
            "| correction | dense leg p50 ms | ratio | search only p50 ms | ratio |",
            "|---|---:|---:|---:|---:|",
            *(f"| {name} | {v['dense_leg_p50_ms']:.2f} | {v['leg_ratio']:.3f} | {v['search_p50_ms']:.3f} | {v['search_ratio']:.3f} |"
              for name, v in bench["hubness_overhead"].items()),
            "",
            " ".join(filter(None, [
                hubness_overhead_sentence(bench["hubness_overhead"]),
                "Inverted softmax searches the augmented index once (one more dimension per bias column); the dynamic "
                "variants search the raw scores first and search again, corrected, only when the raw top-1 is in a bank's "
                "activation set."])),
        ]
    if memory:
        lines += ["", f"Fitting memory: a {memory['bank']:,}-query bank against {memory['docs']:,} documents of dimension "
                  f"{memory['dim']} (and a {memory['gallery']:,}-document gallery) peaked at {memory['peak_rss_mib']:.0f} MiB "
                  f"resident, inputs {memory['inputs_mib']:.0f} MiB, in {memory['fit_seconds']:.0f} s "
                  "(`python -m bench.hubness_memory`)."]
    lines += _inference_sections(bench)
    if filters:
        lines += ["", *filter_bench.markdown(filters).rstrip("\n").splitlines()]
    if live:
        lines += ["", *live_bench.markdown(live).rstrip("\n").splitlines()]
    for report, section in ((query, query_bench), (serving, serving_bench), (rerank, rerank_bench)):
        if report:
            lines += ["", *section.markdown(report).rstrip("\n").splitlines()]
    lines += ["", "## Reproduce", "", "`REBUILD=1 bash scripts/benchmarks.sh` runs `hybrid index`, `hybrid eval`, the filter and "
              "live-write, query-embedding, serving and reranker benchmarks and `hybrid bench` on scifact and regenerates this file.", ""]
    return "\n".join(lines)


def _inference_sections(bench: dict) -> list[str]:
    """Reranker training and latency, ONNX vs torch, batching, FAISS CPU vs GPU (issue: accelerated inference)."""
    lines = []
    training = bench.get("reranker_training")
    if training:
        data, seconds, loss, options = training["data"], training["seconds"], training["loss"], training["options"]
        lines += ["", "## Reranker (`hybrid train-reranker`)", "",
                  f"Trained from `{training['base_model']['name']}` on {data['queries']} queries of the `{data['split']}` split "
                  f"({data.get('dev_queries', 0)} more held out), {data.get('groups_per_epoch', data.get('groups'))} groups per epoch of 1 positive + "
                  f"{options['negatives']} hard negatives resampled each epoch from the hybrid top-{options['mine_depth']}, "
                  f"{options['epochs']} epochs, {training['steps']} steps, {data['pairs']} pairs of at most {options['max_length']} tokens, "
                  f"on {training['device']}: mining {seconds['mining']:.0f} s, training {seconds['training']:.0f} s, ONNX export + int8 "
                  f"{seconds['export']:.0f} s, tuning {seconds.get('tuning', 0):.0f} s. Listwise loss {loss['first_10pct']:.3f} "
                  f"(first 10% of steps) -> {loss['last_10pct']:.3f} (last 10%); chance {loss['chance']:.3f}."]
        tuned = training.get("interpolation")
        if tuned:
            dev = tuned["dev"]
            grid = {w: v for w, v in dev["grid"].items() if round(float(w) * 20) % 2 == 0}  # every 0.1
            lines += ["", f"Interpolation weight tuned on the {dev['queries']} held-out queries (hybrid top {tuned['depth']}, "
                      f"final = w * z(logit) + (1 - w) * z(fused)): w = {tuned['weight']:g}. Their nDCG@10 by weight:", "",
                      "| w | " + " | ".join(grid) + " |", "|---|" + "---:|" * len(grid),
                      "| nDCG@10 | " + " | ".join(f"{v:.4f}" for v in grid.values()) + " |"]
            lines += ["", f"`scripts/benchmarks.sh` tunes the index's fusion on the whole {data['split']} split, held-out queries "
                      "included, so their first stage is in-sample: the curve is biased towards w = 0, not towards the reranker.",
                      "", "Test-split quality: the `+rerank` rows of the quality table (`:w=1` = the cross-encoder's order alone, "
                      "no suffix = the tuned weight, `@int8` = int8 ONNX weights)."]
        else:
            lines += ["", "This model has no tuned interpolation weight: `+rerank` rows use its order alone (w = 1)."]
    rerank = bench.get("rerank_latency")
    if rerank:
        lines += ["", f"Reranking the hybrid top {rerank['depth']} of a query ({rerank['queries']} test queries, same candidates for "
                  f"every backend, interleaved, {rerank['max_length']} tokens per pair, providers {rerank['providers']}):", "",
                  "| backend | p50 ms | p95 ms | pairs/s at p50 |", "|---|---:|---:|---:|"]
        for name in ("torch", "onnx_fp32", "onnx_int8"):
            v = rerank[name]
            lines.append(f"| {name} | {v['p50_ms']:.0f} | {v['p95_ms']:.0f} | {v['pairs_per_s']:.0f} |")
        if "floor" in rerank:
            lines += ["", "Against the compute floor (the pairs' FLOPs at the GEMM peak of all cores): " + "; ".join(
                f"{precision} {v['measured_ms']:.0f} ms vs {v['floor_ms']:.0f} ms, {v['fraction']:.0%} of peak"
                for precision, v in rerank["floor"].items()) + "."]
    embedding = bench.get("query_embedding")
    if embedding:
        lines += ["", f"## Query embedding, one query at a time ({embedding['queries']} test queries, interleaved)", "",
                  "| backend | p50 ms | p95 ms |", "|---|---:|---:|",
                  f"| ONNX Runtime (served) | {embedding['onnx']['p50_ms']:.2f} | {embedding['onnx']['p95_ms']:.2f} |",
                  f"| sentence-transformers (torch) | {embedding['torch']['p50_ms']:.2f} | {embedding['torch']['p95_ms']:.2f} |",
                  "", f"torch / ONNX p50: {embedding['torch_over_onnx_p50']:.2f}x. Passage embedding throughput (indexing, "
                  f"batch 32): {bench['embedding_throughput']['passages_per_s']:.1f} passages/s on {bench['embedding_throughput']['providers']}."]
    floor = bench.get("compute_floor")
    if floor:
        lines += ["", compute_floor_sentence(floor)]
    batching = bench.get("batching")
    if batching:
        lines += ["", "## Micro-batching of concurrent queries (in-process hybrid search, k=10, closed loop)", "",
                  "| variant | queries/s | p50 ms | p99 ms | mean batch |", "|---|---:|---:|---:|---:|"]
        for name, v in batching.items():
            lines.append(f"| {name} | {v['qps']:.1f} | {v['p50_ms']:.1f} | {v['p99_ms']:.1f} | {v.get('mean_batch', '')} |")
        lines += ["", " ".join(filter(None, [
            "Batched: concurrent requests' query embeddings share one model run, one run at a time; a lone request runs at once.",
            batching_sentence(batching),
            "The service batches when `HYBRID_BATCH_QUERIES=on`; `auto` (the default) does so only when the models run on a GPU."]))]
    faiss = bench.get("faiss_cpu_vs_gpu")
    if faiss:
        lines += ["", f"## FAISS search, {faiss['vectors']:,} clustered synthetic unit vectors of dimension {faiss['dimension']}, "
                  f"{faiss['queries']} queries batched", "", "| index, device | queries/s | recall@10 vs flat | build s |",
                  "|---|---:|---:|---:|"]
        for name, v in faiss["results"].items():
            if isinstance(v, dict):
                lines.append(f"| {name} | {v['qps']:.0f} | {v['recall@10_vs_flat']:.4f} | {v['build_s']:.1f} |")
        lines += ["", faiss_device_sentence(faiss)]
    return lines


if __name__ == "__main__":
    index_dir, eval_json, bench_json = map(Path, sys.argv[1:4])
    memory, load, filters, live, query, serving, rerank = (json.loads(Path(arg).read_text()) if arg else None
                                                           for arg in (sys.argv[4:11] + [None] * 7)[:7])
    sys.stdout.write(render(read_manifest(index_dir), json.loads(eval_json.read_text()), json.loads(bench_json.read_text()), memory, load,
                            filters, live, query, serving, rerank))
