#!/usr/bin/env bash
# Create .venv and install the project for this machine: CPU builds, or GPU builds when
# nvidia-smi sees a GPU (override with HYBRID_EXTRA=cpu|gpu). torch is pinned first so that
# sentence-transformers never pulls a CUDA build onto a CPU machine.
set -euo pipefail
cd "$(dirname "$0")/.."
extra="${HYBRID_EXTRA:-$(command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo gpu || echo cpu)}"
# The project installs editable: a .venv set up from this pyproject.toml and this script needs nothing more, and the
# developer's loop skips the minute of pip checks (delete .venv/setup.stamp to force them).
stamp="$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16) ${extra} ${TORCH_VERSION:-2.13.0}"
if [ -x .venv/bin/python ] && [ "$(cat .venv/setup.stamp 2>/dev/null)" = "$stamp" ]; then
  exit 0
fi
python3 -m venv .venv
.venv/bin/pip install -q --upgrade pip
.venv/bin/pip install -q "torch==${TORCH_VERSION:-2.13.0}"
.venv/bin/pip install -q -e ".[${extra},index,profiles,dev,ray,langchain,llamaindex,zh,ja,ko]"
echo "$stamp" > .venv/setup.stamp
echo "installed hybrid-retrieval with the ${extra} extra into .venv"
