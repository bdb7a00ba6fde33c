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
# Hubness: bank = train queries; betas by cross-fitting on them (qbnorm first, then dbnorm keeping beta).
train=(--bank "$BEIR_DATA/scifact/queries.jsonl" --split-qrels "$BEIR_DATA/scifact/qrels/train.tsv")
beta=$(.venv/bin/hybrid hubness fit "$index" "${train[@]}" --method qbnorm --tune | sed -n 's/.*"beta": \([0-9.]*\).*/\1/p')
.venv/bin/hybrid hubness fit "$index" "${train[@]}" --method dbnorm --beta "$beta" --tune
# Cross-encoder reranker, fine-tuned on the train split with hard negatives from the hybrid retriever.
reranker="${RERANKER:-models_out/scifact-reranker}"
# (re)trained when missing, asked for, or made before the interpolation weight was tuned
grep -qs '"interpolation"' "$reranker/training.json" && [ -z "${RETRAIN:-}" ] || .venv/bin/hybrid train-reranker "$index" \
  --queries "$BEIR_DATA/scifact/queries.jsonl" --qrels "$BEIR_DATA/scifact/qrels/train.tsv" --out "$reranker" --quiet
.venv/bin/hybrid eval --data "$BEIR_DATA/scifact" --split test --index "$index" --all-fusions --all-hubness --out "$(dirname "$out")" --quiet \
  --reranker "$reranker" --pipelines bm25,dense,hybrid,bm25+rerank:w=1,bm25+rerank,hybrid+rerank:w=1,hybrid+rerank,hybrid+rerank@int8
.venv/bin/hybrid hubness report "$index" --queries "$BEIR_DATA/scifact/queries.jsonl" --split-qrels "$BEIR_DATA/scifact/qrels/test.tsv" --out "$out/hubness"
[ -f "$out/hubness_memory.json" ] || .venv/bin/python -m bench.hubness_memory > "$out/hubness_memory.json"
.venv/bin/hybrid bench "$index" --data "$BEIR_DATA/scifact" --split test --out "$out/bench.json" \
  --reranker "$reranker" --faiss-vectors "${FAISS_VECTORS:-1000000}"
.venv/bin/python -m bench.load_test "$index" --queries "$BEIR_DATA/scifact/queries.jsonl" --clients 16 --seconds 60 > "$out/load_test.json"
# Filters, highlights and batches on a copy of scifact with synthetic metadata (its own index, built once).
.venv/bin/python -m bench.filter_bench "$BEIR_DATA/scifact" "${FILTER_WORKDIR:-indexes/scifact-metadata}" --out "$out/filters.json" > /dev/null
# Live writes: ingest, visibility, live vs compacted, mixed load (its own index, built once).
.venv/bin/python -m bench.live_bench "$BEIR_DATA/scifact" "${LIVE_WORKDIR:-indexes/scifact-live}" --out "$out/live.json" > /dev/null
# Query embedding: fp32 vs int8 queries (quality, latency), the query cache's hit; documents in int8 (its own index).
[ -f "$index-int8/manifest.json" ] && [ -z "${REBUILD:-}" ] || .venv/bin/hybrid index "$BEIR_DATA/scifact" --out "$index-int8" --precision int8 --quiet
.venv/bin/python -m bench.query_bench "$index" "$BEIR_DATA/scifact" --int8-index "$index-int8" --out "$out/query.json" > /dev/null
# Concurrent serving, configurations side by side at 1/4/16/64 clients; BASELINE=PATH (a checkout of b7fc9f3) adds the
# service as it was before: git worktree add --detach /tmp/before b7fc9f3 && BASELINE=/tmp/before bash scripts/benchmarks.sh;
# the before code cannot open an index written since, so then SERVING_INDEX must be one it built (`cd /tmp/before &&
# HYBRID_CACHE=/tmp/before-cache python -m hybrid_retrieval.cli index ...` and `... -m cli tune ...`), which every version serves
.venv/bin/python -m bench.serving_bench "${SERVING_INDEX:-$index}" "$BEIR_DATA/scifact" ${BASELINE:+--baseline "$BASELINE"} --out "$out/serving.json" > /dev/null
# Rerankers side by side: the 6-layer one above and a 3-layer one distilled from it, cut from the teacher's own layers
# (the default), beside the same student started from the untrained base model (each trained when missing or asked for).
small="${SMALL_RERANKER:-models_out/scifact-reranker-l3}"
for folder in "$small" "$small-base"; do
  start=(); [ "$folder" = "$small-base" ] && start=(--base-model all-MiniLM-L6-v2)
  [ -f "$folder/training.json" ] && [ -z "${RETRAIN:-}" ] || .venv/bin/hybrid train-reranker "$index" --layers 3 --teacher "$reranker" \
    "${start[@]}" --queries "$BEIR_DATA/scifact/queries.jsonl" --qrels "$BEIR_DATA/scifact/qrels/train.tsv" --out "$folder" --quiet
done
.venv/bin/python -m bench.rerank_bench "$index" "$BEIR_DATA/scifact" "6 layers=$reranker" "3 layers, distilled=$small" \
  "3 layers, distilled, from the base model=$small-base" --out "$out/rerank.json" > /dev/null
.venv/bin/python -m bench.benchmarks_md "$index" "$out/report.json" "$out/bench.json" "$out/hubness_memory.json" "$out/load_test.json" \
  "$out/filters.json" "$out/live.json" "$out/query.json" "$out/serving.json" "$out/rerank.json" > docs/BENCHMARKS.md
# Encoder adaptation (models trained when missing or asked for): supervised on the train split, and label-free on
# title / inverse-cloze pseudo-queries mined with an untuned index (no qrels anywhere); each model's index re-embedded
# (`hybrid reembed`) and compared with its base; the fusion tuned on pseudo-queries against RRF. Spliced in last.
queries=(--queries "$BEIR_DATA/scifact/queries.jsonl" --qrels "$BEIR_DATA/scifact/qrels/train.tsv")
embedder="${EMBEDDER:-models_out/scifact-embedder}"
[ -f "$embedder/training.json" ] && [ -z "${RETRAIN:-}" ] || .venv/bin/hybrid train-embedder "$index" "${queries[@]}" --out "$embedder" --quiet
rm -rf "$index-adapted" && cp -r "$index" "$index-adapted" && .venv/bin/hybrid reembed "$index-adapted" --model "$embedder" --quiet > /dev/null
.venv/bin/hybrid eval --data "$BEIR_DATA/scifact" --index "$index-adapted" --baseline-index "$index" --no-tune --quiet --reranker "$reranker" \
  --pipelines bm25,dense,hybrid,rrf:60,hybrid+rerank --out "$out/adapt/supervised" > /dev/null
.venv/bin/hybrid index "$BEIR_DATA/scifact" --out "$index-untuned" --skip-if-current --quiet
adapted=()
for recipe in title ict; do
  model="models_out/scifact-adapt-$recipe"
  [ -f "$model/training.json" ] && [ -z "${RETRAIN:-}" ] || .venv/bin/hybrid adapt "$index-untuned" --out "$model" --recipe "$recipe" \
    --max-queries 1000 --epochs 2 --eval-depth 20 --quiet
  rm -rf "$index-$recipe" && cp -r "$index-untuned" "$index-$recipe" && .venv/bin/hybrid reembed "$index-$recipe" --model "$model" --quiet > /dev/null
  .venv/bin/hybrid eval --data "$BEIR_DATA/scifact" --index "$index-$recipe" --baseline-index "$index-untuned" --no-tune --quiet \
    --pipelines bm25,dense,hybrid --out "$out/adapt/$recipe" > /dev/null
  rm -rf "$index-pseudo-$recipe" && cp -r "$index-untuned" "$index-pseudo-$recipe"
  .venv/bin/hybrid tune "$index-pseudo-$recipe" --pseudo "$recipe" --max-queries 1000 --quiet > /dev/null
  .venv/bin/hybrid eval --data "$BEIR_DATA/scifact" --index "$index-pseudo-$recipe" --baseline-index "$index-untuned" --no-tune --quiet \
    --pipelines hybrid --out "$out/adapt/pseudo-$recipe" > /dev/null
  adapted+=(--model "$recipe pseudo-queries=$model:$out/adapt/$recipe/scifact/report.json"
            --pseudo-tuned "$recipe=$out/adapt/pseudo-$recipe/scifact/report.json")
done
.venv/bin/python -m bench.adapt_bench --model "supervised=$embedder:$out/adapt/supervised/scifact/report.json" "${adapted[@]}" > /dev/null
# Scale-out (the ray extra): bytes a document, FAISS kinds and BM25 by corpus size; Ray builds, the coordinator, Ray Serve
.venv/bin/python -m bench.capacity "$index-untuned" --out "$out/capacity.json" --benchmarks docs/BENCHMARKS.md > /dev/null
.venv/bin/python -m bench.scale_bench "$index-untuned" "$BEIR_DATA/scifact" --out "$out/scale.json" --benchmarks docs/BENCHMARKS.md > /dev/null
.venv/bin/python -m bench.shard_write_bench "$index" "$BEIR_DATA/scifact" --out "$out/shard_writes.json" --benchmarks docs/BENCHMARKS.md > /dev/null
echo "wrote docs/BENCHMARKS.md"
