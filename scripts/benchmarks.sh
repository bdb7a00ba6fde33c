#!/usr/bin/env bash
# Regenerate docs/BENCHMARKS.md and the README's headline table on this machine, from one run of every benchmark
# case (indexes and models they need are made under runs/bench/ first, and reused while present).
# Extra arguments go to `python -m bench run` (e.g. --baseline REF, --only Quality).
set -euo pipefail
cd "$(dirname "$0")/.."
export BEIR_DATA="${BEIR_DATA:-../shared/data/beir}" HF_HUB_OFFLINE=1
record="runs/bench/record-$(date -u +%Y%m%dT%H%M%S).json"
.venv/bin/python -m bench run --out "$record" "$@"
.venv/bin/python -m bench render "$record"
