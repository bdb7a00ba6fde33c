#!/usr/bin/env bash
# Regenerate docs/BENCHMARKS.md and the README's headline table on this machine, from one run of every benchmark
# case. The indexes and models the cases measure are made first under runs/bench/ (hours on a small CPU, once; reused
# while present), so the run itself only measures. On a small machine the run takes hours: run this again after an
# interruption and it resumes the same commit's record, keeping the cases that ran (a changed checkout starts over).
# To re-measure a few cases only: `python -m bench run --only CASE ... --out R.json` then `python -m bench render R.json --update`.
# Extra arguments go to `python -m bench run` (e.g. --baseline REF).
set -euo pipefail
cd "$(dirname "$0")/.."
export BEIR_DATA="${BEIR_DATA:-../shared/data/beir}" HF_HUB_OFFLINE=1
record="runs/bench/record-$(git rev-parse --short=12 HEAD).json"
.venv/bin/python -m bench prepare
.venv/bin/python -m bench run --out "$record" --resume "$@"
.venv/bin/python -m bench render "$record"
