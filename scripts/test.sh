#!/usr/bin/env bash
# Install into .venv and run the default test suite (slow, GPU, Docker and crash tests are deselected: .ci/run runs
# all of them but the GPU tests); `--fast` runs the fast tier (no service, no other process, no training) instead.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# The playground's browser tests drive Debian's Chromium (Playwright downloads no browser here): install it when we
# can; without it those tests skip, saying so.
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  (apt-get install -y -qq chromium >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq chromium >/dev/null 2>&1)) \
    || echo "could not install chromium: the browser tests will skip"
fi
export BEIR_DATA="${BEIR_DATA:-../shared/data/beir}"
# --fast: the developer's tier, the default suite without the tests that start the service (marker `server`), run
# Python in another process (`process`) or train a model (`training`)
if [ "${1:-}" = "--fast" ]; then
  shift
  exec .venv/bin/python -m pytest -q -m "not slow and not gpu and not docker and not crash and not server and not process and not training" "$@"
fi
exec .venv/bin/python -m pytest -q "$@"
