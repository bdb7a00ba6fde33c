#!/usr/bin/env bash
# Regenerate docs/BENCHMARKS.md and the README's headline table on this machine, from one run of every benchmark
# case. The indexes and models the cases measure are made first under runs/bench/ (hours on a small CPU, once; reused
# while present), so the run itself only measures. Extra arguments go to `python -m bench run` (e.g. --baseline REF).
set -euo pipefail
cd "$(dirname "$0")/.."
export BEIR_DATA="${BEIR_DATA:-../shared/data/beir}" HF_HUB_OFFLINE=1
record="runs/bench/record-$(date -u +%Y%m%dT%H%M%S).json"
.venv/bin/python -m bench prepare
.venv/bin/python -m bench run --out "$record" "$@"
.venv/bin/python -m bench render "$record"
