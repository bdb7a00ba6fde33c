#!/usr/bin/env bash
# Fresh machine -> serving: install, find BEIR scifact (or fall back to the demo corpus in examples/demo), index it and
# tune its fusion on the training queries (the first run only), then serve on 127.0.0.1:8000 with a data directory for
# new collections and a write key, printed and kept in data/write.key. Every example in README.md works against it.
#   BEIR_DATA      a folder holding scifact/ (default: ../shared/data/beir, then data/beir; else a download there)
#   HYBRID_NO_DOWNLOAD=1  never download: the demo corpus when scifact is not on disk
#   HYBRID_INDEX   where the index goes (default indexes/<dataset>)
#   HYBRID_DATA    the data directory (default data)
#   HYBRID_SKIP_SETUP=1   skip the install (the tests run this script in an installed checkout)
set -euo pipefail
cd "$(dirname "$0")/.."
say() { printf 'run.sh: %s\n' "$*" >&2; }

if [ "${HYBRID_SKIP_SETUP:-}" != 1 ]; then
  say "installing into .venv (about 5 minutes the first time on 2 cores, seconds after)"
  bash scripts/setup.sh
fi
hybrid=.venv/bin/hybrid

dataset=""
if [ -n "${BEIR_DATA:-}" ]; then roots=("$BEIR_DATA"); else roots=(../shared/data/beir data/beir); fi
for root in "${roots[@]}"; do
  if [ -f "$root/scifact/corpus.jsonl" ]; then
    dataset="$root/scifact"
    break
  fi
done
if [ -z "$dataset" ] && [ "${HYBRID_NO_DOWNLOAD:-}" != 1 ]; then
  say "scifact is not on disk: downloading it into ${BEIR_DATA:-data/beir}"
  dataset="$("$hybrid" download-beir scifact --to "${BEIR_DATA:-data/beir}")" || dataset=""
fi
if [ -z "$dataset" ]; then
  dataset=examples/demo
  say "no scifact (set BEIR_DATA to a folder holding scifact/): serving the 22-document demo corpus in $dataset instead"
fi

name="$(basename "$dataset")"
index="${HYBRID_INDEX:-indexes/$name}"
if [ ! -f "$index/manifest.json" ]; then
  say "indexing $dataset ($(wc -l <"$dataset/corpus.jsonl") documents) into $index: the first run embeds every document, about 4 minutes for scifact's 5,183 on 2 CPU cores"
  "$hybrid" index "$dataset" --out "$index"
  if [ -f "$dataset/qrels/train.tsv" ]; then
    say "tuning the fusion on scifact's training queries (about a minute; the test queries are never used)"
    "$hybrid" tune "$index" --queries "$dataset/queries.jsonl" --qrels "$dataset/qrels/train.tsv" --quiet
  fi
fi

data="${HYBRID_DATA:-data}"
mkdir -p "$data"
keyfile="$data/write.key"
if [ ! -s "$keyfile" ]; then
  (umask 077 && .venv/bin/python -c 'import secrets; print(secrets.token_urlsafe(24))' >"$keyfile")
fi
host="${HYBRID_HOST:-127.0.0.1}"
port="${HYBRID_PORT:-8000}"
say "serving $index as collection '$name' (the default one) on http://$host:$port; collections you create go to $data/"
say "write key: $(cat "$keyfile")   (in another shell: KEY=\$(cat $keyfile); searches and writes send it as X-API-Key)"
HYBRID_WRITE_KEYS="$(cat "$keyfile")" exec "$hybrid" serve --index "$index" --data "$data" --host "$host" --port "$port" --log-format text
