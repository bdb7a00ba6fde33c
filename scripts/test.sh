#!/usr/bin/env bash
# Install into .venv and run the test suite (slow, GPU and Docker tests are deselected by default).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export BEIR_DATA="${BEIR_DATA:-../shared/data/beir}"
exec .venv/bin/python -m pytest -q "$@"
