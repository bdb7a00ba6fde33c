#!/usr/bin/env bash
# Fresh machine -> serving scifact: install, fetch scifact if absent, index it, tune fusion on train, serve on 127.0.0.1:8000.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export BEIR_DATA="${BEIR_DATA:-data/beir}"
dataset="$(.venv/bin/hybrid download-beir scifact --to "$BEIR_DATA")"
index="${HYBRID_INDEX:-indexes/scifact}"
if [ ! -f "$index/manifest.json" ]; then
  .venv/bin/hybrid index "$dataset" --out "$index"
  # Tune the fusion on the training split (never test) so the service starts with the best one.
  if [ -f "$dataset/qrels/train.tsv" ]; then
    .venv/bin/hybrid tune "$index" --queries "$dataset/queries.jsonl" --qrels "$dataset/qrels/train.tsv" --quiet
  fi
fi
exec .venv/bin/hybrid serve --index "$index" --host "${HYBRID_HOST:-127.0.0.1}" --port "${HYBRID_PORT:-8000}"
