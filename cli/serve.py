"""`hybrid serve` (starts the HTTP service, which owns its flags) and `hybrid search` (one query, no server)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from cli.args import add_device
from indexer.store import open_index
from models.cross_encoder import load_cross_encoder, rerank_weight
from models.onnx_export import PRECISIONS
from search.errors import ConfigError
from search.rerank import DEFAULT_RERANK_DEPTH
from search.spec import MODES, parse_spec_string


def register(commands) -> None:
    # every flag goes to the service itself (app/__main__.py): `hybrid serve --help` lists them
    p = commands.add_parser("serve", help="serve POST /search over HTTP (flags: hybrid serve --help)", add_help=False)
    p.set_defaults(run=run_serve)

    p = commands.add_parser("search", help="query an index from the command line")
    p.add_argument("index", type=Path)
    p.add_argument("query")
    p.add_argument("--mode", choices=MODES)
    p.add_argument("--spec", help="search spec in its string form, e.g. 'hybrid+cc:zscore:0.45+rerank:w=0.5' (see README)")
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--json", action="store_true")
    p.add_argument("--reranker", help=f"rerank the top {DEFAULT_RERANK_DEPTH} with this cross-encoder (e.g. a `hybrid train-reranker` folder)")
    p.add_argument("--reranker-precision", choices=PRECISIONS, default="fp32")
    p.add_argument("--rerank-weight", type=float, help="interpolation weight of the cross-encoder, 0..1 (default: its tuned weight, else 1)")
    add_device(p)
    p.set_defaults(run=run_search)


def run_serve(args) -> None:
    # The service is its own program (app/__main__.py): exec it, so signals such as SIGHUP reach it directly.
    os.execv(sys.executable, [sys.executable, "-m", "app", *args.options])


def run_search(args) -> None:
    if args.rerank_weight is not None and not args.reranker:
        raise ConfigError("--rerank-weight needs --reranker")
    if args.mode and args.spec:
        raise ConfigError("give --mode or --spec (which starts with the mode), not both")
    spec = parse_spec_string(args.spec) if args.spec else {"mode": args.mode} if args.mode else {}
    index = open_index(args.index, verify="size", device=args.device)
    model, reranking = None, {}
    if args.reranker:
        model = load_cross_encoder(args.reranker, device=args.device, precision=args.reranker_precision)
        reranking = {"rerank": {"enabled": True, "weight": rerank_weight(args.reranker, args.rerank_weight)}}
    result = index.pipeline(reranking, cross_encoder=model, cross_encoder_name=args.reranker or "").search(args.query, args.k, spec)
    hits = []
    for rank, (doc_idx, score) in enumerate(zip(result.ranking.doc_idx, result.ranking.scores), start=1):
        doc = index.docs.get(int(doc_idx))
        hits.append({"rank": rank, "id": doc["id"], "score": float(score), "title": doc["title"]})
    if args.json:
        print(json.dumps({"query": args.query, "spec": result.spec.to_dict(), "hits": hits, "timings_ms": result.timings_ms}, indent=2))
        return
    for hit in hits:
        print(f"{hit['rank']:>4}  {hit['score']:10.4f}  {hit['id']:<16} {hit['title'][:80]}")
    print(f"({result.timings_ms['total']:.1f} ms, {result.spec.to_string()})")
