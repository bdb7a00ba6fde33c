#!/usr/bin/env bash
# Regenerate docs/BENCHMARKS.md on this machine: index scifact, evaluate, benchmark, render.
set -euo pipefail
cd "$(dirname "$0")/.."
export BEIR_DATA="${BEIR_DATA:-../shared/data/beir}"
index="${INDEX:-indexes/scifact}"
out="${OUT:-runs/scifact}"
mkdir -p "$out"
if [ ! -f "$index/manifest.json" ] || [ -n "${REBUILD:-}" ]; then
  .venv/bin/hybrid index "$BEIR_DATA/scifact" --out "$index" --quiet
fi
# Fusion is tuned on the train split only; test queries are used for evaluation alone.
.venv/bin/hybrid tune "$index" --queries "$BEIR_DATA/scifact/queries.jsonl" --qrels "$BEIR_DATA/scifact/qrels/train.tsv" --out "$out/tuning" --quiet
.venv/bin/hybrid eval --data "$BEIR_DATA/scifact" --split test --index "$index" --all-fusions --out "$out" --quiet
.venv/bin/hybrid bench "$index" --data "$BEIR_DATA/scifact" --split test --out "$out/bench.json"
.venv/bin/python -m evaluation.benchmarks_md "$index" "$out/report.json" "$out/bench.json" > docs/BENCHMARKS.md
echo "wrote docs/BENCHMARKS.md"
